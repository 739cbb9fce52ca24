"""Kept so that ``from monitor.cli import main`` (older scripts, wrappers) still starts the CLI.

The command line itself lives beside the core, in the top-level ``cli`` package
(``cli/main.py``, commands in ``cli/commands/``); the core never imports it.
"""

from cli.main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
