"""How long the job stays in each place, and a place held past its normal time: pure functions.

The exporter reads where the job's driver is (py-spy, ``monitor.hang.where``) at a steady low
rate through the whole run; each reading is a place: the phase, what the process does and the
frame the classifier names (``Reading.key``). Consecutive readings at the same place, with no
step ending between them, are one *hold* (``since``: the first reading, ``last``: the newest):
the job stayed there at least ``last - since`` seconds.

For each place the run keeps how long it normally takes (:meth:`DwellTracker.normal`): the
longest step timer of its phase (``timing_s/reward``: "the reward phase takes 0.8 s a step")
and the longest hold of the same place seen before. A hold longer than its limit,

    ``max(hold_multiple x normal, normal + hold_margin_s, hold_min_s)``,

is over (:class:`Assessment`). Places long by nature (a generation, a validation, a checkpoint,
work in a GPU kernel: ``where.LONG_PHASES``) are judged against their own history with
``long_hold_multiple``: never on their first occurrence (no history), never during the first
step (warm-up), and the ``hang`` detector adds that the GPUs must not be computing.

No clock, no I/O: :class:`DwellTracker` is fed readings and step ends in any order, and
:func:`replay` turns a timeline of py-spy rounds (``hang_dump`` events, as ``analyze
--stacks`` reads them from the dumps the exporter saved) and steps into the over-events the
live exporter publishes, so a test covers 100-second steps in milliseconds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from monitor.hang.where import LONG_PHASES, WORKER_CALL
from monitor.records import Event, StepRecord

#: Roles whose place says where the job is (the ones the steady readings follow).
DRIVER_ROLES: frozenset[str] = frozenset(("driver", "trainer", "rollouter"))
#: Most reading times kept per hold (a hold of a day at 10 s is 8,640).
MAX_TIMES = 4096


@dataclass(frozen=True)
class HoldLimits:
    """When a hold is over: see the module docstring (the ``hang`` section's ``hold_*``)."""

    multiple: float = 2.0
    margin_s: float = 10.0
    min_s: float = 15.0
    long_multiple: float = 3.0

    @classmethod
    def from_config(cls, cfg: Mapping) -> HoldLimits:
        """From the ``hang`` config section (missing keys keep their defaults)."""
        get = getattr(cfg, "get_float", None)
        if get is None:
            return cls()
        d = cls()
        return cls(get("hold_multiple", d.multiple), get("hold_margin_s", d.margin_s),
                   get("hold_min_s", d.min_s), get("long_hold_multiple", d.long_multiple))

    def limit(self, normal: float, long: bool, history: bool) -> float:
        """Seconds a place may be held (infinite for a long place without history)."""
        if long and not history:
            return math.inf
        m = self.long_multiple if long else self.multiple
        return max(m * normal, normal + self.margin_s, self.min_s)


def frame_function(frame: str) -> str:
    """``name (file)`` of a frame written ``name (file:line)`` (the line dropped: a loop moves
    between the lines of one function while it stays in it)."""
    if frame.endswith(")") and " (" in frame:
        name, _, rest = frame.rpartition(" (")
        return f"{name} ({rest[:-1].rsplit(':', 1)[0]})"
    return frame


@dataclass(frozen=True)
class Reading:
    """Where one process was at one time (one py-spy dump, classified)."""

    time: float
    pid: int | None
    role: str
    place: str
    phase: str = ""
    frame: str = ""  # "name (file:line)"

    @property
    def key(self) -> tuple[str, str, str]:
        """The place: (phase, what it does, frame function)."""
        return (self.phase, self.place, frame_function(self.frame))

    @classmethod
    def from_where(cls, time: float, w: Mapping) -> Reading:
        """From a ``Where.to_dict()`` (a ``hang_dump`` event's ``who`` / ``others``)."""
        pid = w.get("pid")
        return cls(float(time), int(pid) if isinstance(pid, (int, float)) else None,
                   str(w.get("role") or ""), str(w.get("place") or ""),
                   str(w.get("phase") or ""), str(w.get("frame") or ""))


@dataclass
class Hold:
    """Consecutive readings of one process at one place, no step ending between them."""

    pid: int | None
    role: str
    key: tuple[str, str, str]
    since: float
    last: float
    frame: str
    times: list[float] = field(default_factory=list)
    frames: set[str] = field(default_factory=set)

    @property
    def held_s(self) -> float:
        """Seconds between the first and the newest reading (at least this long there)."""
        return self.last - self.since

    @property
    def place(self) -> str:
        """What the process does there (``where`` place)."""
        return self.key[1]

    @property
    def phase(self) -> str:
        """The phase of the place ('' when the classifier named none)."""
        return self.key[0]

    @property
    def steady_frame(self) -> bool:
        """True when every reading named the same frame, line included (no progress seen)."""
        return len(self.frames) <= 1


@dataclass(frozen=True)
class Assessment:
    """A hold judged against the run's history: how long it is normally, the limit, and whether
    it is over. ``phase`` / ``place`` / ``function`` are what the words name."""

    held_s: float
    normal_s: float
    source: str  # "timer": the phase's step timer, "hold": an earlier hold, "": no history
    limit_s: float
    over: bool
    long: bool
    warmup: bool  # the hold began before the first step ended: not judged
    since: float
    phase: str
    place: str
    function: str

    @property
    def history(self) -> bool:
        """True when the place (or its phase) was seen before in this run."""
        return bool(self.source)

    @property
    def due(self) -> float | None:
        """When the hold passes its limit, if it lasts (None: never judged)."""
        if self.warmup or math.isinf(self.limit_s):
            return None
        return self.since + self.limit_s

    def words(self) -> str:
        """"in compute_score for 40 s; reward takes at most 0.8 s a step in this run (limit
        15 s)"."""
        head = f"in {self.function or self.place} for {_secs(self.held_s)}"
        if self.source == "timer":
            norm = (f"{self.phase} takes at most {_secs(self.normal_s)} a step in this run")
        elif self.source == "hold":
            norm = f"it was held at most {_secs(self.normal_s)} before in this run"
        else:
            norm = "it was never held before in this run"
        lim = "" if math.isinf(self.limit_s) else f" (limit {_secs(self.limit_s)})"
        return f"{head}; {norm}{lim}"

    def to_dict(self) -> dict:
        """Plain data for the over-event (``hang_dump`` data ``hold``)."""
        return {"since": round(self.since, 3), "held_s": round(self.held_s, 3),
                "normal_s": round(self.normal_s, 3), "source": self.source,
                "limit_s": None if math.isinf(self.limit_s) else round(self.limit_s, 3),
                "over": self.over, "long": self.long, "warmup": self.warmup,
                "phase": self.phase, "place": self.place, "function": self.function,
                "words": self.words()}


def _secs(s: float) -> str:
    if s < 1:
        return f"{s:.2f} s"
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


class DwellTracker:
    """Holds of the driver processes, the step ends that cut them, and each place's history."""

    def __init__(self, limits: HoldLimits | None = None) -> None:
        self.limits = limits or HoldLimits()
        self.marks: list[float] = []  # step ends, sorted
        self.phase_longest: dict[str, float] = {}  # phase -> longest step timer
        self.held_longest: dict[tuple[str, str, str], float] = {}  # place -> longest hold
        self.holds: dict[int | None, Hold] = {}  # pid -> its current hold

    # ------------------------------------------------------------------ feeding
    def add_step(self, end: float | None, phases: Mapping[str, float] | None = None) -> None:
        """A step ended at ``end`` with these phase timers: holds are cut at it."""
        for phase, secs in (phases or {}).items():
            if isinstance(secs, (int, float)) and math.isfinite(secs) and secs > 0:
                self.phase_longest[phase] = max(self.phase_longest.get(phase, 0.0), float(secs))
        if end is None or not math.isfinite(end):
            return
        i = bisect.bisect_left(self.marks, end)
        if i < len(self.marks) and self.marks[i] == end:
            return
        self.marks.insert(i, float(end))
        for pid, h in list(self.holds.items()):  # a step that ended inside a hold cuts it
            if h.since < end < h.last:
                before = [t for t in h.times if t <= end]
                after = [t for t in h.times if t > end]
                self._complete(h.key, (before[-1] if before else h.since) - h.since)
                self.holds[pid] = Hold(h.pid, h.role, h.key, after[0], h.last, h.frame,
                                       after, {h.frame})

    def add_steps(self, steps: Iterable[StepRecord]) -> None:
        """Every step's end and timers."""
        for s in steps:
            phases = dict(s.phases or {})
            if s.total:
                phases.setdefault("step", float(s.total))
            if s.data_wait:  # the batch fetch before the step's timer: the loader's time
                phases.setdefault("data_wait", float(s.data_wait))
            self.add_step(None if s.end_time is None else float(s.end_time), phases)

    def add_reading(self, r: Reading) -> Hold:
        """One reading; returns the hold it belongs to (a new one when the place changed or a
        step ended since the process's last reading)."""
        h = self.holds.get(r.pid)
        if h is not None and r.time < h.last:
            return h  # out of order: a reading older than the newest is ignored
        if h is not None and h.key == r.key and not self._mark_in(h.last, r.time):
            h.last = r.time
            h.frame = r.frame
            h.frames.add(r.frame)
            if len(h.times) < MAX_TIMES:
                h.times.append(r.time)
            return h
        if h is not None:
            self._complete(h.key, h.held_s)
        h = Hold(r.pid, r.role, r.key, r.time, r.time, r.frame, [r.time], {r.frame})
        self.holds[r.pid] = h
        return h

    def forget(self, pid: int | None) -> None:
        """A process no longer followed: its hold ends."""
        h = self.holds.pop(pid, None)
        if h is not None:
            self._complete(h.key, h.held_s)

    def _complete(self, key: tuple[str, str, str], held: float) -> None:
        if held > self.held_longest.get(key, 0.0):
            self.held_longest[key] = held
        else:
            self.held_longest.setdefault(key, 0.0)

    def _mark_in(self, a: float, b: float) -> bool:
        """True when a step ended in (a, b]."""
        i = bisect.bisect_right(self.marks, a)
        return i < len(self.marks) and self.marks[i] <= b

    # ------------------------------------------------------------------ judging
    def normal(self, key: tuple[str, str, str], phase: str = "") -> tuple[float, str]:
        """(seconds, source) the place normally takes: the longest step timer of its phase
        ("timer") or the longest earlier hold of it ("hold"); (0, "") without history."""
        timer = self.phase_longest.get(phase or key[0]) if (phase or key[0]) else None
        held = self.held_longest.get(key)
        if timer is None and held is None:
            return 0.0, ""
        if held is None or (timer is not None and timer >= held):
            return float(timer or 0.0), "timer"
        return float(held), "hold"

    def assess(self, h: Hold, place: str = "", phase: str = "", long: bool | None = None,
               function: str = "") -> Assessment:
        """Judge hold ``h`` (``place`` / ``phase`` / ``long``: what a full round says the job
        does there, when known; by default the hold's own place)."""
        place = place or h.place
        phase = phase or h.phase
        long = (place in LONG_PHASES) if long is None else long
        normal, source = self.normal(h.key, phase)
        warmup = not self.marks or self.marks[0] > h.since
        limit = self.limits.limit(normal, long, bool(source))
        over = not warmup and h.held_s >= limit
        fn = function or h.key[2].split(" (", 1)[0]
        return Assessment(h.held_s, normal, source, limit, over, long, warmup, h.since, phase,
                          place, fn)


# ---------------------------------------------------------------------------- offline replay
def round_readings(event: Event) -> list[Reading]:
    """The driver processes' readings of one py-spy round (a ``hang_dump`` event)."""
    where = (event.data or {}).get("where") or {}
    out = []
    for w in list(where.get("who") or []) + list(where.get("others") or []):
        if isinstance(w, Mapping) and str(w.get("role") or "") in DRIVER_ROLES and \
                w.get("place") != "gone":
            out.append(Reading.from_where(float(event.time), w))
    return out


def judge_round(tracker: DwellTracker, h: Hold, where: Mapping) -> Assessment:
    """Assess hold ``h`` with what the whole round says (its verdict ``where``): a stuck
    verdict is judged as the place it names, a long one (validation, checkpoint, generation,
    a kernel) against its own history; the frame named is the verdict's first process's."""
    who = [w for w in (where.get("who") or []) if isinstance(w, Mapping)]
    function = str(who[0].get("frame") or "").split(" (", 1)[0] if who else ""
    place = str(where.get("place") or "")
    long = bool(where.get("long_phase"))
    if place == WORKER_CALL and not where.get("stuck"):
        long = False
    return tracker.assess(h, place=place, phase=str(where.get("phase") or ""), long=long,
                          function=function)


def over_event(round_event: Event, a: Assessment) -> Event:
    """The over-event: the round's ``hang_dump`` with the hold's assessment in ``hold``."""
    data = dict(round_event.data or {})
    data["hold"] = a.to_dict()
    return Event("hang_dump", round_event.time, message=round_event.message, data=data)


def replay(rounds: Sequence[Event], steps: Iterable[StepRecord],
           limits: HoldLimits | None = None) -> list[Event]:
    """The over-events of a timeline of py-spy rounds (each a ``hang_dump`` event with a
    ``where`` verdict) and the steps around them, as the live exporter publishes them."""
    tracker = DwellTracker(limits)
    ordered = sorted((s for s in steps if s.end_time is not None),
                     key=lambda s: float(s.end_time))
    rounds = sorted((e for e in rounds if e.time is not None), key=lambda e: float(e.time))
    out: list[Event] = []
    i = 0
    for ev in rounds:
        while i < len(ordered) and float(ordered[i].end_time) <= float(ev.time):
            tracker.add_steps([ordered[i]])
            i += 1
        where = (ev.data or {}).get("where") or {}
        for r in round_readings(ev):
            a = judge_round(tracker, tracker.add_reading(r), where)
            if a.over:
                out.append(over_event(ev, a))
                break
    return out
