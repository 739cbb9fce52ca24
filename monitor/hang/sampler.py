"""Steady readings of where the job is, and a place held past its normal time made an event.

Every ``hang.sample_s`` seconds (10 by default) through the whole run, the exporter reads the
job's driver process(es) with py-spy (without pausing them: ``--nonblocking``) and feeds each
reading to a :class:`~monitor.hang.dwell.DwellTracker`. When a driver's hold reaches its limit
(or the moment it would, if it lasts: a reading is taken then), every process of the job is
read (a *full* round) and judged (``where.judge``); a hold over its limit whose verdict is stuck
(a reward, an HTTP answer, the data loader, a worker method, ...) or long by nature (judged by
the ``hang`` detector against its history and the GPUs) becomes a ``hang_dump`` event with the
assessment in ``data["hold"]`` (``monitor.hang.dwell.over_event``), again every
``republish_s`` while it lasts. A hold that turns out long by nature keeps that verdict until it
ends: the next full round is taken only when its own (longer) limit passes.

:class:`HoldSampler` has no clock and runs no py-spy itself: the caller gives the time and a
function that takes a round, so a test plays 100-second steps in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from monitor.hang.dwell import (
    DRIVER_ROLES,
    Assessment,
    DwellTracker,
    Hold,
    HoldLimits,
    Reading,
    judge_round,
    over_event,
)
from monitor.hang.procs import JobProcess
from monitor.hang.stacks import StackRound
from monitor.records import Event, StepRecord

#: ``round_fn(processes, full)``: one py-spy round of those processes (``full``: every process
#: of the job, for a verdict).
RoundFn = Callable[[list[JobProcess], bool], StackRound]


@dataclass(frozen=True)
class HangState:
    """The current hang verdict: the driver's place, how long it has been held there, how long
    it normally takes, and whether that is a hang (``words``: "in compute_score for 40 s; ...").
    """

    hang: bool
    pid: int | None
    role: str
    place: str
    phase: str
    frame: str
    since: float
    held_s: float
    normal_s: float
    limit_s: float | None
    words: str
    summary: str = ""  # the last full round's verdict in words ('' before one)


@dataclass
class _Judged:
    """What the last full round said of a hold: its place, phase, whether long, the frame."""

    since: float
    place: str
    phase: str
    long: bool
    function: str
    stuck: bool
    summary: str
    published: float | None = None


@dataclass
class HoldSampler:
    """The steady readings' schedule, the tracker, and the over-events (see the module)."""

    limits: HoldLimits = field(default_factory=HoldLimits)
    sample_s: float = 10.0
    republish_s: float = 30.0
    node: str = ""
    tracker: DwellTracker = field(init=False)
    assessments: dict[int | None, Assessment] = field(default_factory=dict)
    _judged: dict[int | None, _Judged] = field(default_factory=dict)
    _next: float = 0.0
    _confirm_at: float | None = None
    _steps_seen: set[float] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.tracker = DwellTracker(self.limits)

    def add_steps(self, steps: Iterable[StepRecord]) -> None:
        """The steps seen so far (each is taken once, by its end time)."""
        for s in steps:
            if s.end_time is not None and float(s.end_time) not in self._steps_seen:
                self._steps_seen.add(float(s.end_time))
                self.tracker.add_steps([s])

    def keep_only(self, pids: Iterable[int]) -> None:
        """Forget the processes no longer the job's (gone, or no longer proven)."""
        keep = set(pids)
        for pid in [p for p in self.assessments if p not in keep]:
            self.assessments.pop(pid, None)
            self._judged.pop(pid, None)
            self.tracker.forget(pid)

    def due(self, now: float) -> str | None:
        """``confirm`` when a hold reaches its limit now, ``steady`` when a reading is due."""
        if self._confirm_at is not None and now >= self._confirm_at:
            return "confirm"
        return "steady" if now >= self._next else None

    def run(self, now: float, procs: Sequence[JobProcess], round_fn: RoundFn) -> list[Event]:
        """Take the due reading(s) at ``now``: the drivers' (steady), then every process's
        when a hold is at its limit; returns the over-events to publish."""
        kind = self.due(now)
        if kind is None or not procs:
            return []
        self._next = now + self.sample_s
        drivers = [p for p in procs if p.role in DRIVER_ROLES]
        if not drivers:
            return []  # a node without the driver: its place is read in a silence only
        full = kind == "confirm"
        got = round_fn(list(procs) if full else drivers, full)
        confirm, events = self.take(now, got, full)
        if confirm and not full:
            _, more = self.take(now, round_fn(list(procs), True), True)
            events += more
        return events

    def take(self, now: float, got: StackRound, full: bool) -> tuple[bool, list[Event]]:
        """Feed one round at ``now``: (a full round is needed, the over-events)."""
        verdict = got.verdict.to_dict() if (full and got.verdict is not None) else None
        summary = got.verdict.summary() if (full and got.verdict is not None) else ""
        events: list[Event] = []
        need = False
        for w in got.wheres:
            if w.role not in DRIVER_ROLES:
                continue
            h = self.tracker.add_reading(Reading(now, w.pid, w.role, w.place, w.phase,
                                                 str(w.frame) if w.frame else ""))
            a = self._assess(h, verdict, summary)
            self.assessments[w.pid] = a
            j = self._judged.get(w.pid)
            if not full:
                need = need or (a.over and (j is None or j.since != h.since))
                continue
            if a.over and j is not None and (j.stuck or a.long) and (
                    j.published is None or now - j.published >= self.republish_s - 1e-6):
                j.published = now
                events.append(over_event(got.to_event(now, self.node), a))
        for g in got.gone:
            self.tracker.forget(g.pid)
        self._confirm_at = self._next_confirm(now)
        return need, events

    def _assess(self, h: Hold, verdict: dict | None, summary: str) -> Assessment:
        """Judge ``h``: with the full round's verdict when given (and kept for the hold's
        life), else with what the last full round of this hold said, else its own place."""
        if verdict is not None:
            a = judge_round(self.tracker, h, verdict)
            old = self._judged.get(h.pid)
            self._judged[h.pid] = _Judged(h.since, a.place, a.phase, a.long, a.function,
                                          bool(verdict.get("stuck")), summary,
                                          old.published if old and old.since == h.since
                                          else None)
            return a
        j = self._judged.get(h.pid)
        if j is not None and j.since == h.since:
            return self.tracker.assess(h, j.place, j.phase, j.long, j.function)
        return self.tracker.assess(h)

    def _next_confirm(self, now: float) -> float | None:
        """When the next full round is due: a hold reaching its limit, or an over one to be
        published again."""
        times = []
        for pid, a in self.assessments.items():
            j = self._judged.get(pid)
            judged = j is not None and j.since == a.since
            if a.over and judged and j.published is not None:
                times.append(j.published + self.republish_s)
            elif a.over and judged:
                continue  # over but neither stuck nor long: nothing more to ask
            elif a.due is not None and a.due > now:
                times.append(a.due)
        return min(times) if times else None

    def state(self) -> HangState | None:
        """The current hang verdict (the driver nearest to, or furthest past, its limit)."""
        best: tuple[float, int | None, Assessment] | None = None
        for pid, a in self.assessments.items():
            ratio = a.held_s / a.limit_s if a.limit_s and a.limit_s != float("inf") else 0.0
            if best is None or ratio > best[0]:
                best = (ratio, pid, a)
        if best is None:
            return None
        _, pid, a = best
        h = self.tracker.holds.get(pid)
        j = self._judged.get(pid)
        judged = j is not None and j.since == a.since
        return HangState(
            hang=bool(a.over and judged and (j.stuck or a.long) and j.published is not None),
            pid=pid, role=h.role if h else "", place=a.place, phase=a.phase,
            frame=h.frame if h else "", since=a.since, held_s=a.held_s, normal_s=a.normal_s,
            limit_s=None if a.limit_s == float("inf") else a.limit_s, words=a.words(),
            summary=j.summary if judged else "")
