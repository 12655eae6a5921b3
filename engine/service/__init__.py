"""Foundations of the live rescheduling service (issue 10): job specifications and the
SQLite state store. The daemon, its HTTP API and status page are not built yet."""
