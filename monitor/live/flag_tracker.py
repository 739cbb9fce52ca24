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
        #: adopted flags (from a previous process): their start never moves; the reason is
        #: added to the evidence of those closing before any call reported them again
        self._adopted: dict[tuple[str, str], str | None] = {}
        #: why the run is over (``finish``), while it is: ``update`` then opens nothing
        self.finished: str | None = None
        #: when it ended and its last step (``verlmon_run_end_timestamp_seconds``)
        self.finished_at: float | None = None
        self.finished_step: int | None = None
        #: ``now`` of the previous ``update`` (None before the first)
        self.checked_at: float | None = None

    def finish(self, now: float, reason: str, step: int | None = None) -> list[Flag]:
        """The run is over: close every open flag as "run finished" (``reason`` says what
        showed it; ``step`` its last step) and open nothing new until ``resume``. Returns the
        flags closed."""
        self.finished = reason
        self.finished_at, self.finished_step = now, step
        closed = []
        for key in list(self._open):
            f = self._open.pop(key)
            self._adopted.pop(key, None)
            note = f"run finished: {reason}"
            closed.append(replace(f, end=max(now, f.start),
                                  evidence=f"{f.evidence} ({note})" if f.evidence else note))
        return closed

    def resume(self) -> None:
        """A new run goes on after a finished one: flags open again."""
        self.finished = None
        self.finished_at = self.finished_step = None

    def adopt(self, flags: list[Flag], reason: str | None = None) -> int:
        """Take over flags a previous process left open (read back from the store): they are
        open here with their stored start, so a call that still reports them opens nothing
        new. One the next ``update`` does not report closes with ``reason`` appended to its
        evidence. Returns how many were adopted (closed ones and duplicates are skipped)."""
        count = 0
        for f in flags:
            key = flag_key(f)
            if f.end is not None or key in self._open:
                continue
            self._open[key] = copy.deepcopy(f)
            self._adopted[key] = reason
            count += 1
        return count

    def update(self, flags: list[Flag], now: float) -> tuple[list[Flag], list[Flag]]:
        """Take the flags of one ``run_all`` call; return (newly opened, newly closed).

        A flag reported open (end None) keeps or opens its entry; an open entry no longer
        reported open closes with the reported end time, or ``now`` when the call no longer
        mentions it. A flag that began and ended after the previous call, never seen open (the
        detectors did not run while it lasted: a busy machine, a sped-up replay), is returned
        both opened and closed. Severity rises while open, never falls. After ``finish``:
        nothing opens, nothing closes (until ``resume``).
        """
        if self.finished is not None:
            return [], []
        since, self.checked_at = self.checked_at, now
        seen = set(self._open)  # open before this call: their end closes them below
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
                self._count(new.kind, new.severity)
            else:
                start = min(have.start, f.start)
                if key in self._adopted:  # announced with its stored start: keep it
                    start = have.start
                    self._adopted[key] = None  # seen again: an ordinary close later
                severity = have.severity
                if _RANK.get(f.severity, 0) > _RANK.get(have.severity, 0):
                    severity = f.severity
                    self._count(f.kind, severity)
                self._open[key] = replace(copy.deepcopy(f), start=start, severity=severity)
        for key in list(self._open):
            if key in current:
                continue
            f = self._open.pop(key)
            end = ended.get(key, now)
            reason = self._adopted.pop(key, None)
            if reason:
                f = replace(f, evidence=f"{f.evidence} ({reason})" if f.evidence else reason)
            closed.append(replace(f, end=max(end, f.start)))
        if since is not None:
            closed += self._between(flags, seen | set(current), since, opened)
        return opened, closed

    def _count(self, kind: str, severity: str) -> None:
        """One more flag raised at ``severity`` (``raised_counts``)."""
        self._raised[(kind, severity)] = self._raised.get((kind, severity), 0) + 1

    def _between(self, flags: list[Flag], seen: set[tuple[str, str]], since: float,
                 opened: list[Flag]) -> list[Flag]:
        """The flags that opened and closed since the previous call (``since``), their keys
        not in ``seen`` (open before, or open now): each is added to ``opened`` and counted;
        returns them (closed)."""
        whole: dict[tuple[str, str], Flag] = {}
        for f in flags:
            key = flag_key(f)
            if f.end is None or f.end <= since or key in seen:
                continue
            prev = whole.get(key)
            if prev is None or f.end > prev.end:
                whole[key] = f
        out = []
        for f in whole.values():
            opened.append(copy.deepcopy(f))
            self._count(f.kind, f.severity)
            out.append(copy.deepcopy(f))
        return out

    def active(self) -> list[Flag]:
        """The flags open now, oldest first."""
        return sorted((copy.deepcopy(f) for f in self._open.values()), key=lambda f: f.start)

    def raised_counts(self) -> dict[tuple[str, str], int]:
        """How many flags were raised per (kind, severity) since the tracker started.

        A flag whose severity rises while open counts once more at the higher severity.
        """
        return dict(self._raised)
