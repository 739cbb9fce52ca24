"""The ``verl-monitor`` command line, beside the core: ``cli.main`` and one module a command."""
