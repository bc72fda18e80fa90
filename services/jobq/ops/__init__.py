"""The operator's face: the ``jobq`` command line, one module per verb group,
and what it drives (migrations and statement functions, admin verbs, uninstall)."""
