"""Live flag tracking for the exporter: successive ``run_all`` calls on a rolling window.

Each call sees only a recent window, so the same problem comes back as a fresh flag every time.
``FlagTracker`` merges them by (kind, scope label): a flag keeps its original start while it
stays open, and closes (with an end time) when a call no longer reports it open. It also counts
the flags raised, per (kind, severity), for the ``verlmon_flags_raised_total`` counter.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from monitor.records import SEVERITIES, Flag

_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def flag_key(flag: Flag) -> tuple[str, str]:
    """The identity of a flag across calls: its kind and scope label (steps left out)."""
    return (flag.kind, flag.scope_label)


class FlagTracker:
    """Merges the flags of successive detector runs into open/closed flags with stable starts."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], Flag] = {}
        self._raised: dict[tuple[str, str], int] = {}

    def update(self, flags: list[Flag], now: float) -> tuple[list[Flag], list[Flag]]:
        """Take the flags of one ``run_all`` call; return (newly opened, newly closed).

        A flag reported open (end None, or ending at/after the previous check) keeps or opens
        its entry; an open entry no longer reported open closes with the reported end time, or
        ``now`` when the call no longer mentions it. Severity rises while open, never falls.
        """
        current: dict[tuple[str, str], Flag] = {}
        ended: dict[tuple[str, str], float] = {}
        for f in flags:
            key = flag_key(f)
            if f.end is None:
                prev = current.get(key)
                if prev is None or _RANK.get(f.severity, 0) > _RANK.get(prev.severity, 0):
                    current[key] = f
            else:
                ended[key] = max(ended.get(key, f.end), f.end)
        opened: list[Flag] = []
        closed: list[Flag] = []
        for key, f in current.items():
            have = self._open.get(key)
            if have is None:
                new = copy.deepcopy(f)
                self._open[key] = new
                opened.append(copy.deepcopy(new))
                rk = (new.kind, new.severity)
                self._raised[rk] = self._raised.get(rk, 0) + 1
            else:
                start = min(have.start, f.start)
                severity = have.severity
                if _RANK.get(f.severity, 0) > _RANK.get(have.severity, 0):
                    severity = f.severity
                    rk = (f.kind, severity)
                    self._raised[rk] = self._raised.get(rk, 0) + 1
                self._open[key] = replace(copy.deepcopy(f), start=start, severity=severity)
        for key in list(self._open):
            if key in current:
                continue
            f = self._open.pop(key)
            end = ended.get(key, now)
            closed.append(replace(f, end=max(end, f.start)))
        return opened, closed

    def active(self) -> list[Flag]:
        """The flags open now, oldest first."""
        return sorted((copy.deepcopy(f) for f in self._open.values()), key=lambda f: f.start)

    def raised_counts(self) -> dict[tuple[str, str], int]:
        """How many flags were raised per (kind, severity) since the tracker started.

        A flag whose severity rises while open counts once more at the higher severity.
        """
        return dict(self._raised)
