"""Subcommands of the `arena` CLI, one module (or package: `bench`) each."""
