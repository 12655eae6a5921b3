"""The live rescheduling service (``arena serve``): its settings (``config``), job
specifications, the SQLite state store, the daemon that runs rounds over the launcher,
its HTTP API and status page, and the clients (docs/service.md)."""
