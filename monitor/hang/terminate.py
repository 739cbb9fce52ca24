"""``--on-hang terminate``: when a hung job may be ended, and ending its process tree.

Ending a job is the one thing the monitor does *to* it, so :func:`decide` says yes only when
every one of these holds, and otherwise says which one failed:

1. a critical ``hang`` flag is open;
2. it has held for ``after_s`` (default 10 min) since it opened;
3. py-spy stack rounds find the job stuck at one place (the same verdict,
   ``monitor.hang.where``, the same processes at the same frames) without a break for
   ``after_s`` up to now: an unbroken stretch of rounds, no two of them, nor the newest and
   now, more than twice ``restack_s`` apart, counted from the flag's start when its first
   round came within that of it. A late round or a move restarts the count (the hang must
   then hold ``after_s`` again) instead of refusing for the rest of the hang;
4. the place is not a phase the job's own history shows can last that long: the longest wall
   time between two step lines around steps that ran that phase (validation, a checkpoint
   save, a long generation, the data wait before a step) is shorter than the silence now;
5. the job's own process tree is known (:func:`job_root`: the exporter was started by
   ``verl-monitor run``, whose child is the job).

Then :func:`end_tree` sends SIGTERM to every process of the tree and SIGKILL to those still
there after ``grace_s``. The module's I/O is in :func:`job_root` and :func:`end_tree`; the
decision is pure (the live wing, ``monitor.live.hang_action``, and the replay tests feed it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor.records import Event, Flag, StepRecord

#: Defaults of ``--on-hang-after``, ``--on-hang-grace`` and ``--on-hang-restack``.
DEFAULT_AFTER_S = 600.0
DEFAULT_GRACE_S = 30.0
DEFAULT_RESTACK_S = 60.0
#: Phases that are the wait before a step (all steps have it).
_BEFORE_STEP = ("data_wait", "data", "")


@dataclass(frozen=True)
class HangPolicy:
    """The guards' settings (see the module's docstring)."""

    after_s: float = DEFAULT_AFTER_S
    restack_s: float = DEFAULT_RESTACK_S
    grace_s: float = DEFAULT_GRACE_S


@dataclass
class Decision:
    """Whether to end the job now, and why (or why not), in words."""

    act: bool
    why: str
    place: str = ""
    held_s: float = 0.0
    rounds: int = 0
    #: the guard that failed: flag, hold (also: rounds at one place since the flag's start, too
    #: few or too short yet), stacks (the rounds' count restarted: a gap, a move, none stuck),
    #: phase, tree ('' when acting)
    guard: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the ``hang_action`` event."""
        return {"act": self.act, "why": self.why, "place": self.place,
                "held_s": round(self.held_s, 3), "rounds": self.rounds, "guard": self.guard}


def is_stack_round(event: Event) -> bool:
    """A py-spy round (``hang_dump`` event, method ``py-spy``)."""
    return event.kind == "hang_dump" and (event.data or {}).get("method") == "py-spy"


def round_place(event: Event) -> tuple | None:
    """What a stack round says of a stuck job, as a comparable value: the verdict's place and
    phase, and each process named with its role, PID and frame; None when it is not stuck."""
    where = (event.data or {}).get("where") or {}
    if not where.get("stuck"):
        return None
    who = tuple(sorted((str(w.get("role") or ""), int(w.get("pid") or 0),
                        str(w.get("frame") or "")) for w in where.get("who") or []))
    return (str(where.get("place") or ""), str(where.get("phase") or ""), who)


def place_words(event: Event) -> str:
    """The round's verdict in words: its first sentence (who, where, which frame)."""
    return str(event.message or "").split(". ")[0].strip().rstrip(".")


def longest_interval(steps: Iterable[StepRecord], phase: str) -> tuple[float, int]:
    """The longest wall time between two consecutive step lines where the later step ran
    ``phase`` (any step for the wait before a step or an unknown phase), and how many such
    intervals the job's history holds."""
    timed = sorted((s for s in steps if s.end_time is not None), key=lambda s: s.end_time)
    best, n = 0.0, 0
    for prev, rec in zip(timed, timed[1:], strict=False):
        if rec.step <= prev.step:
            continue  # a resume: the previous line belongs to another attempt
        ran = phase in _BEFORE_STEP or float(rec.phases.get(phase) or 0.0) > 0
        if ran:
            best, n = max(best, float(rec.end_time) - float(prev.end_time)), n + 1
    return best, n


def _stretch(rounds: list[Event], flag: Flag, now: float, pol: HangPolicy
             ) -> tuple[list[Event], float, str]:
    """The newest unbroken stretch of stack rounds at one place: the rounds (oldest first),
    when its cover starts (the flag's start when its first round came within twice
    ``restack_s`` of it, else that round's time; ``now`` when there is none) and why it does
    not reach further back ('' when it reaches the flag's start).

    The stretch ends at the newest round (no older than twice ``restack_s``) and goes back
    while each round finds the job stuck at the newest one's place and no two rounds are more
    than twice ``restack_s`` apart. A late round or a move therefore restarts the count rather
    than refusing for the rest of the hang."""
    gap = 2.0 * pol.restack_s
    if not rounds:
        return [], now, "no stack round since the flag opened"
    if now - float(rounds[-1].time) > gap:
        return [], now, (f"the newest stack round is {now - float(rounds[-1].time):.0f} s old "
                         f"(over {gap:.0f} s)")
    places = [round_place(e) for e in rounds]
    place = places[-1]
    if place is None:
        return [], now, "the newest stack round found no process stuck"
    for k in range(len(rounds) - 1, 0, -1):
        cur = float(rounds[k].time)
        apart = cur - float(rounds[k - 1].time)
        if apart > gap:
            return rounds[k:], cur, (
                f"two stack rounds {apart:.0f} s apart (over {gap:.0f} s) before it")
        if places[k - 1] != place:
            moved = sum(1 for p in places[:k] if p != place)
            what = ("no process stuck" if places[k - 1] is None else
                    "the job elsewhere: it moves")
            return rounds[k:], cur, f"{moved} of {len(rounds)} stack rounds found {what}"
    first = float(rounds[0].time) - float(flag.start)
    if first > gap:
        return rounds, float(rounds[0].time), (
            f"the first stack round came {first:.0f} s after the flag's start (over {gap:.0f} s)")
    return rounds, float(flag.start), ""


def decide(flag: Flag | None, events: Iterable[Event], steps: Iterable[StepRecord],
           now: float, policy: HangPolicy = HangPolicy(), tree: str | None = None
           ) -> Decision:
    """Whether to end the job at ``now`` (see the module's docstring). ``events``: the stack
    rounds seen (``hang_dump``, py-spy; others are ignored); ``steps``: the job's history;
    ``tree``: why the job's process tree is not known (None: it is)."""
    if flag is None or flag.kind != "hang" or flag.severity != "critical" or flag.end is not None:
        return Decision(False, "no critical hang flag is open", guard="flag")
    held = now - float(flag.start)
    steps = list(steps)
    if held < policy.after_s:
        return Decision(False, f"the hang has held {held:.0f} s of the {policy.after_s:.0f} s "
                        "required", held_s=held, guard="hold")
    rounds = sorted((e for e in events if is_stack_round(e) and e.time is not None
                     and float(flag.start) - policy.restack_s <= float(e.time) <= now),
                    key=lambda e: float(e.time))
    stretch, since, broken = _stretch(rounds, flag, now, policy)
    covered = now - since
    if len(stretch) < 2 or covered < policy.after_s:
        why = (f"{len(stretch)} stack round(s) at one place: at least 2 are needed"
               if len(stretch) < 2 else
               f"stack rounds have found the same place for {covered:.0f} s of the "
               f"{policy.after_s:.0f} s required")
        # unbroken but short: the place has not held long enough yet (a wait, like the hold);
        # broken: the rounds say why the count restarted
        return Decision(False, f"{why}; {broken}" if broken else why, held_s=held,
                        rounds=len(stretch), guard="stacks" if broken else "hold")
    rounds = stretch
    where, phase = place_words(rounds[-1]), round_place(rounds[-1])[1]
    last = max((float(s.end_time) for s in steps if s.end_time is not None
                and float(s.end_time) <= float(flag.start)), default=float(flag.start))
    silence = now - last
    longest, n = longest_interval(steps, phase)
    if n and longest >= silence:
        return Decision(False, f"the job's own history shows {phase or 'a step'} lasting: "
                        f"{longest:.0f} s between two step lines around it, as long as this "
                        f"silence ({silence:.0f} s)", where, held, len(rounds), "phase")
    if tree is not None:
        return Decision(False, tree, where, held, len(rounds), "tree")
    past = (f"the longest time between two step lines around a {phase or 'step'} in the "
            f"job's history is {longest:.0f} s" if n else
            f"the job's history holds no {phase or 'step'} to compare with")
    why = (f"the hang held {held:.0f} s (required {policy.after_s:.0f} s), {len(rounds)} stack "
           f"rounds found the same place ({where}); {past}, the silence is {silence:.0f} s")
    return Decision(True, why, where, held, len(rounds))


# ---------------------------------------------------------------------------- the job's tree
def _is_run(cmdline: list[str]) -> bool:
    """Whether a command line is ``verl-monitor run`` (the script, or ``python -m monitor``)."""
    text = " ".join(cmdline)
    return "run" in cmdline and ("verl-monitor" in text or "monitor" in cmdline)


def job_root(parent: int | None = None) -> tuple[int | None, str]:
    """(the PID of the job's command, '') when this process was started by ``verl-monitor
    run`` (``parent``; by default our parent, proven by the PID run put in our environment:
    ``monitor.hang.procs.run_parent``), whose one other child is the job; else (None, why not).
    The one place that says which tree is the job's."""
    import psutil

    if parent is None:
        from monitor.hang.procs import run_parent

        parent = run_parent()  # proven: run named itself to us and is still our parent
        if parent is None:
            return None, ("the job's process tree is not known: this exporter was not started "
                          "by verl-monitor run")
    try:
        run = psutil.Process(parent)
        if not _is_run(run.cmdline()):
            return None, ("the job's process tree is not known: this exporter was not started "
                          "by verl-monitor run")
        kids = [c for c in run.children() if c.pid != os.getpid()]
    except (psutil.Error, OSError) as exc:
        return None, f"the job's process tree is not known ({exc})"
    if len(kids) != 1:
        return None, (f"the job's process tree is not known: verl-monitor run (PID {parent}) "
                      f"has {len(kids)} other children")
    return kids[0].pid, ""


@dataclass
class Ended:
    """What :func:`end_tree` did: the PIDs sent SIGTERM, those SIGKILLed after the grace
    period, and those that could not be signalled (with why)."""

    root: int
    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def words(self) -> str:
        """One sentence for Slack, the store and the log."""
        text = (f"SIGTERM to {len(self.terminated)} process(es) of the job's tree (root PID "
                f"{self.root})")
        if self.killed:
            text += f", SIGKILL to {len(self.killed)} still running after the grace period"
        if self.failed:
            text += f"; {len(self.failed)} could not be signalled"
        return text + f" ({self.seconds:.1f} s)"


def end_tree(root: int, grace_s: float = DEFAULT_GRACE_S) -> Ended:
    """SIGTERM to ``root`` and every process under it, SIGKILL to the ones still alive after
    ``grace_s``. Never this process, its parent or PID 1."""
    import psutil

    t0 = time.monotonic()
    out = Ended(root)
    mine = {os.getpid(), os.getppid(), 1}
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except (psutil.Error, OSError) as exc:
        out.failed[root] = str(exc)
        return out
    procs = [p for p in procs if p.pid not in mine]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
            out.terminated.append(p.pid)
        except psutil.NoSuchProcess:
            continue
        except (psutil.Error, OSError) as exc:
            out.failed[p.pid] = str(exc)
    _, alive = psutil.wait_procs(procs, timeout=max(0.0, grace_s))
    for p in alive:
        try:
            p.kill()
            out.killed.append(p.pid)
        except psutil.NoSuchProcess:
            continue
        except (psutil.Error, OSError) as exc:
            out.failed[p.pid] = str(exc)
    psutil.wait_procs(alive, timeout=5.0)
    out.seconds = time.monotonic() - t0
    return out
