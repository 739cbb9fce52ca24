"""How a command fails: it raises ``CommandError``, printed once where the command is entered.

Each command's ``run`` is wrapped in ``exits(NAME)``: a ``CommandError`` raised anywhere
inside becomes one line on stderr, ``verl-monitor NAME: MESSAGE``, and the exit status the
error's code: 2 for bad input (a missing file, a bad option, a missing extra), 1 when the
work itself failed. A command never prints its own failure and returns a status.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from monitor.printable import printable

#: Exit status of bad input: the same as argparse's usage errors.
BAD_INPUT = 2
#: Exit status of a command that started and failed.
FAILED = 1


class CommandError(Exception):
    """A command cannot go on: ``message`` (one line, without the ``verl-monitor COMMAND:``
    prefix) for stderr and the exit ``code``."""

    def __init__(self, message: str, code: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def fail_if(problem: str | None | bool, code: int = BAD_INPUT) -> None:
    """Raise ``CommandError(problem, code)`` when a check found a ``problem`` (a non-empty
    string); return quietly on ``None`` or ``""``."""
    if problem:
        raise CommandError(str(problem), code)


def warn(command: str, message: str) -> None:
    """A line on stderr that does not stop ``command`` (``verl-monitor COMMAND: MESSAGE``),
    made printable (a file name or a peer's answer in it cannot act on the terminal)."""
    print(f"verl-monitor {command}: {printable(message, keep='')}", file=sys.stderr)


def report(command: str, error: CommandError) -> int:
    """Print ``error`` as ``command``'s one stderr line (made printable); the exit status to
    return."""
    print(f"verl-monitor {command}: {printable(error.message, keep='')}", file=sys.stderr)
    return error.code


def exits(command: str) -> Callable[[Callable[[Any], int]], Callable[[Any], int]]:
    """Wrap a command's ``run(args)``: a ``CommandError`` it raises is printed as
    ``command``'s one stderr line and its code returned as the exit status."""

    def wrap(run: Callable[[Any], int]) -> Callable[[Any], int]:
        @functools.wraps(run)
        def entered(args: Any) -> int:
            try:
                return run(args)
            except CommandError as exc:
                return report(command, exc)

        return entered

    return wrap
