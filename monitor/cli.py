"""The ``verl-monitor`` command line: one subcommand per module in ``monitor/commands/``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed namespace and returning the exit status. A module
that fails to import (a missing optional dependency) is reported only when its command is used.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommands, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = ("demo", "analyze", "simulate", "exporter", "export", "dashboard")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    from monitor import __version__

    parser = argparse.ArgumentParser(
        prog="verl-monitor",
        description="Live performance monitor for verl RL post-training: which phase wastes "
        "the GPUs, with evidence and a concrete fix.",
    )
    parser.add_argument("--version", action="version", version=f"verl-monitor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"monitor.commands.{name}")
        except ImportError as exc:
            broken = sub.add_parser(name, help=f"(unavailable: {exc})")
            broken.set_defaults(func=_unavailable(name, exc))
            continue
        module.register(sub)
    return parser


def _unavailable(name: str, exc: Exception):
    def run(_args: argparse.Namespace) -> int:
        print(f"verl-monitor {name}: unavailable ({exc})", file=sys.stderr)
        return 2

    return run


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``verl-monitor`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
