"""The cross-rank comparison: which rank holds the others.

Pure functions of the dumps (and, for the fallback, of py-spy stacks). In one process group
every rank issues the same collectives in the same order, so their sequence numbers line up:

- a rank whose last *enqueued* collective is behind a collective the others wait in never
  issued it: it stopped before it (its last frame says where it was);
- a member that sent no dump while the others wait is gone or not answering (killed, crashed);
- when every rank issued it and the dumps track starts (``TORCH_NCCL_ENABLE_TIMING=1``), a rank
  that has not *started* it has a GPU still busy with earlier work;
- a rank alone whose collective is queued behind work that never ends is stuck in a kernel.

Otherwise the dumps name no rank, and say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from monitor.hang.dump import Frame, GroupStatus, Pending, RankDump
from monitor.records import Event


@dataclass(frozen=True)
class RankInfo:
    """Where a rank runs, where known."""

    node: str = ""
    gpu: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class Culprit:
    """A rank named as holding the others, with why, in words (rank -1: a process whose rank is
    unknown, named by its PID)."""

    rank: int
    reason: str
    pg: str = ""
    collective: str = ""
    seq: int | None = None
    frame: Frame | None = None
    node: str = ""
    gpu: int | None = None
    pid: int | None = None

    def describe(self) -> str:
        """One sentence naming the rank, where it runs and why."""
        where = ", ".join(x for x in (
            f"node {self.node}" if self.node else "",
            f"GPU {self.gpu}" if self.gpu is not None else "",
            f"PID {self.pid}" if self.pid is not None else "") if x)
        who = f"rank {self.rank}" if self.rank >= 0 else "a process"
        text = who + (f" ({where})" if where else "") + f": {self.reason}"
        if self.frame is not None:
            text += f"; last at {self.frame}"
        return text


@dataclass
class Localization:
    """The comparison's answer: culprits (possibly none), and what the waiting ranks wait in."""

    culprits: list[Culprit] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # rank -> "nccl:all_reduce #18 ..."
    note: str = ""
    method: str = "flight_recorder"

    def to_event(self, time: float | None, node: str = "", seconds: float = 0.0,
                 problems: dict[str, str] | None = None) -> Event:
        """The ``hang_dump`` event the ``hang`` detector reads (message: the summary)."""
        return Event("hang_dump", time, message=self.summary(), data={
            "method": self.method, "seconds": round(seconds, 3), "node": node,
            "waiting": {str(k): v for k, v in self.waiting.items()},
            "culprits": [{"rank": c.rank, "reason": c.reason, "pg": c.pg,
                          "collective": c.collective, "seq": c.seq,
                          "frame": str(c.frame) if c.frame else "", "node": c.node,
                          "gpu": c.gpu, "pid": c.pid} for c in self.culprits],
            "problems": dict(problems or {})})

    def summary(self) -> str:
        """One line for a flag's evidence."""
        if self.culprits:
            head = "; ".join(c.describe() for c in self.culprits[:4])
            more = len(self.culprits) - 4
            if more > 0:
                head += f"; and {more} more"
            if self.waiting:
                ranks = sorted(self.waiting)
                shown = ",".join(str(r) for r in ranks[:8]) + ("..." if len(ranks) > 8 else "")
                head += f". Waiting: rank(s) {shown} in {self.waiting[ranks[0]]}"
            return head
        return self.note or "the dumps name no rank"


def _describe_pending(p: Pending) -> str:
    return f"{p.name} #{p.seq} ({p.state})" + (f" issued at {p.frame}" if p.frame else "")


def _info(infos: Mapping[int, RankInfo], rank: int) -> dict:
    i = infos.get(rank, RankInfo())
    return {"node": i.node, "gpu": i.gpu, "pid": i.pid}


def _group_members(dumps: Mapping[int, RankDump], pg: str) -> set[int]:
    members: set[int] = set()
    for d in dumps.values():
        g = d.groups.get(pg)
        if g is not None:
            members.add(d.rank)
            members.update(r for r in g.ranks if r >= 0)
    return members


def localize_dumps(dumps: Mapping[int, RankDump], missing: Mapping[int, str] | None = None,
                   infos: Mapping[int, RankInfo] | None = None) -> Localization:
    """Compare the ranks' dumps; ``missing`` maps ranks without a dump to why (in words)."""
    missing = dict(missing or {})
    infos = infos or {}
    out = Localization()
    named: set[int] = set()
    pgs = sorted({pg for d in dumps.values() for pg in d.groups})
    for pg in pgs:
        status: dict[int, GroupStatus] = {r: d.groups[pg] for r, d in dumps.items()
                                          if pg in d.groups}
        waiting = {r: g.pending[0] for r, g in status.items() if g.pending}
        if not waiting:
            continue
        front = max(p.seq for p in waiting.values())
        some = waiting[max(waiting, key=lambda r: waiting[r].seq)]
        for r, p in waiting.items():
            out.waiting.setdefault(r, _describe_pending(p))
        members = _group_members(dumps, pg)
        for r in sorted(members - set(status)):
            if r in named:
                continue
            why = missing.get(r, "sent no dump")
            out.culprits.append(Culprit(
                rank=r, reason=f"no Flight Recorder dump ({why}) while rank(s) wait in "
                f"{some.name} #{some.seq}", pg=pg, collective=some.name, seq=some.seq,
                **_info(infos, r)))
            named.add(r)
        behind = [r for r, g in status.items() if g.enqueued < front and r not in named]
        for r in sorted(behind):
            g = status[r]
            out.culprits.append(Culprit(
                rank=r, reason=f"never issued {some.name} #{front} that the others wait in "
                f"(its last collective in process group {pg} is #{g.enqueued})", pg=pg,
                collective=some.name, seq=front, frame=g.last_frame, **_info(infos, r)))
            named.add(r)
        if behind or (members - set(status)):
            continue
        started = {r: g.started for r, g in status.items()}
        if any(s >= 0 for s in started.values()):
            top = max(started.values())
            late = [r for r, s in started.items() if s < top and r not in named]
            for r in sorted(late):
                p = waiting.get(r)
                out.culprits.append(Culprit(
                    rank=r, reason=f"issued {p.name if p else 'the collective'} #{top} but its GPU "
                    "never started it: the GPU is still busy with earlier work", pg=pg,
                    collective=p.name if p else "", seq=top, frame=p.frame if p else None,
                    **_info(infos, r)))
                named.add(r)
        if len(status) == 1 and len(members) <= 1 and not named:
            r, p = next(iter(waiting.items()))
            if p.state == "scheduled":
                out.culprits.append(Culprit(
                    rank=r, reason=f"{p.name} #{p.seq} is queued behind GPU work that has not "
                    "finished (stuck in a kernel)", pg=pg, collective=p.name, seq=p.seq,
                    frame=p.frame, **_info(infos, r)))
                named.add(r)
    if not out.culprits:
        if out.waiting:
            out.note = ("every rank issued the same collective and none finished it: the "
                        "collective itself is stuck (network, NCCL) or a GPU is busy with earlier "
                        "work; compare the GPUs' SM activity, or set TORCH_NCCL_ENABLE_TIMING=1")
        elif missing and not dumps:
            out.note = "no rank sent a dump: " + "; ".join(
                f"rank {r}: {why}" for r, why in sorted(missing.items())[:4])
        else:
            out.note = "no collective is pending on any rank: the job is not waiting in NCCL"
    # the ranks that wait are not culprits
    for c in out.culprits:
        out.waiting.pop(c.rank, None)
    return out
