"""Subcommands of the `arena` CLI, one module each."""
