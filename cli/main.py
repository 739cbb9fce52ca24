"""The ``verl-monitor`` command line: one subcommand per module in ``cli/commands/``.

Each command module names its parser's ``PARSER`` keywords (help, description, ...), adds
its options in ``add_arguments(parser)`` and runs in ``run(args)``, which returns the exit
status (a command that cannot go on raises ``cli.errors.CommandError``; see
``cli/errors.py``). Command
modules import only the core install at the top; a command that needs an extra checks for it
when it runs (``monitor.extras``) and names the extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommands, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = ("demo", "analyze", "simulate", "exporter", "run", "export", "dashboard",
                             "prometheus-config")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    from monitor import __version__

    parser = argparse.ArgumentParser(
        prog="verl-monitor",
        description="Live performance monitor for verl RL post-training: which phase wastes "
        "the GPUs, with evidence and a concrete fix.",
    )
    parser.add_argument("--version", action="version", version=f"verl-monitor {__version__}")
    # the subcommand's name goes to its own attribute: ``run`` has a positional ``command``
    # (the job's command line), which must not replace it
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in COMMANDS:
        command = importlib.import_module(f"cli.commands.{name.replace('-', '_')}")
        sub_parser = sub.add_parser(name, **command.PARSER)
        command.add_arguments(sub_parser)
        sub_parser.set_defaults(func=command.run)
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` (the top-level parser when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``verl-monitor`` console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # an unknown option after a subcommand is that subcommand's usage error, not the
        # top-level one ("verl-monitor analyze --bogus" prints analyze's usage)
        _subparser(parser, getattr(args, "subcommand", None) or "").error(
            "unrecognized arguments: " + " ".join(extra))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
