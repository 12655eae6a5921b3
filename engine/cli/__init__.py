"""The ``arena`` command line: ``main`` (the entry point), one module per command under
``commands/`` (a command imports no other command), and what several commands share:
``common`` (the flags they share and what they build from them), ``progress``,
``flags``, ``jsonout``. ``python -m engine.cli`` runs it."""
