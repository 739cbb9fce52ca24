"""The headline every surface leads with: is the run healthy, what does it lose, what to do.

One computation for the Overview's banner and bar, the Flags page, ``analyze`` (text and
``--json``), wandb's run summary and the exporter's ``/metrics``: the goodput ledger's
GPU-seconds by cause over a span (monitor/analysis/goodput.py: the last steps of a live run,
the whole of a finished one), the open flags and the run's end. The names are the ledger's
causes (the ``cause`` label of ``verlmon_gpu_seconds_total``) and the flags' kinds, nothing
else.

The banner speaks for the detectors:

- a ``hang`` flag open: the hang, and nothing else (its advice replaces every other);
- warning or critical flags open: "Needs attention", naming the one to act on first;
- none open: "Healthy"; the largest loss is named as information, never as a warning;
- the run finished: "Finished", with its end time and last step.

Both dashboard modes feed it the same numbers: the run store holds the ledger the exporter
counted step by step, Prometheus the counters it counted them into.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from monitor.analysis.goodput import CAUSES, LOST_CAUSES
from monitor.records import SEVERITIES, Flag

#: Steps of a live run the headline looks back over (the Overview's "last steps").
SPAN_STEPS = 20
#: Flag severities the banner speaks for (``info`` flags are notes, not problems).
LOUD = ("warning", "critical")
#: The flag kinds each ledger cause is named by (cross-node alerts count as their flag kind).
_FLAG_CAUSES: dict[str, tuple[str, ...]] = {}


def _flag_causes() -> dict[str, tuple[str, ...]]:
    if not _FLAG_CAUSES:
        from monitor.analysis.run_analysis import FLAG_CAUSES

        _FLAG_CAUSES.update(FLAG_CAUSES)
    return _FLAG_CAUSES


@dataclass(frozen=True)
class RunEnd:
    """A finished run: when it ended, its last step, and what said so (the log's last
    progress line, the final validation, the job's exit)."""

    time: float
    step: int | None = None
    reason: str = ""

    def words(self) -> str:
        """"at 10:19:48 UTC after step 42 (the job exited with status 0)"."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.time))
        text = f"at {when} UTC"
        if self.step is not None:
            text += f" after step {self.step}"
        return text + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Headline:
    """What the banner says and the numbers it rests on (shares are of the span's GPU-seconds)."""

    state: str  # "healthy", "warning", "critical" or "finished"
    text: str
    span: str  # "the last 20 steps", "the run"
    gpu_seconds: float = 0.0
    goodput: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    top_loss: str | None = None
    top_loss_share: float | None = None
    top_flag: Flag | None = None
    top_flag_share: float | None = None
    flagged_as: str | None = None  # the open flag kind that names the top loss
    finished: RunEnd | None = None
    hang: bool = False
    open_flags: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``headline`` object of ``analyze --json`` (and wandb's summary)."""
        return {
            "state": self.state, "text": self.text, "span": self.span,
            "gpu_seconds": round(self.gpu_seconds, 3),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "top_loss": self.top_loss,
            "top_loss_share": None if self.top_loss_share is None
            else round(self.top_loss_share, 4),
            "top_flag": None if self.top_flag is None else self.top_flag.kind,
            "top_flag_share": None if self.top_flag_share is None
            else round(self.top_flag_share, 4),
            "flagged_as": self.flagged_as, "open_flags": self.open_flags, "hang": self.hang,
            "finished": None if self.finished is None else {
                "time": self.finished.time, "step": self.finished.step,
                "reason": self.finished.reason},
            "shares": {c: round(v, 4) for c, v in self.shares.items()},
        }


def cause_seconds(led: pd.DataFrame | None) -> dict[str, float]:
    """GPU-seconds per cause of a ledger frame (``goodput.ledger``'s columns), every cause."""
    if led is None or len(led) == 0:
        return {c: 0.0 for c in CAUSES}
    return {c: float(led[c].sum()) if c in led.columns else 0.0 for c in CAUSES}


def last_steps(led: pd.DataFrame, n_steps: int = SPAN_STEPS) -> pd.DataFrame:
    """The rows of the ledger's last ``n_steps`` steps (by end; the run's tail row, from its
    last step to its end, is no step and left out)."""
    if led is None or len(led) == 0:
        return led
    rows = led[~led["tail"].astype(bool)] if "tail" in led.columns else led
    keys = rows[["step", "end"]].drop_duplicates().sort_values("end")
    keep = keys.tail(n_steps)
    want = set(zip(keep["step"].astype(int), keep["end"].astype(float), strict=True))
    mask = [(int(s), float(e)) in want for s, e in zip(rows["step"], rows["end"], strict=True)]
    return rows[mask]


def shares_of(seconds: Mapping[str, float]) -> dict[str, float]:
    """Each cause's share of the GPU-seconds (causes with none left out); empty without any."""
    total = sum(max(float(v), 0.0) for v in seconds.values())
    if total <= 0:
        return {}
    return {c: float(v) / total for c, v in seconds.items() if float(v) > 0}


def rank_open(flags: Iterable[Flag], seconds: Mapping[str, float],
              suppress: Mapping[str, Iterable[str]] | None = None) -> list[tuple[Flag, float]]:
    """The open warning and critical flags in the order to act on them, each with the share
    of the span's GPU-seconds in the causes it names (with those of the flags it explains):
    a hang first (nothing else moves until it does), then the most severe, then the costliest,
    a cause before what it explains, then the newest."""
    loud = [f for f in flags if f.end is None and f.severity in LOUD]
    shares = shares_of(seconds)
    rules = {k: set(v or ()) for k, v in (suppress or {}).items()}
    base = {"GPUStraggler": "gpu_imbalance", "NodeImbalance": "gpu_imbalance"}
    causes = _flag_causes()

    def explains(a: Flag, b: Flag) -> bool:
        return base.get(a.kind, a.kind) in rules.get(base.get(b.kind, b.kind), ())

    def own(f: Flag) -> float:
        return sum(shares.get(c, 0.0) for c in causes.get(f.kind, ()))

    rank = {s: i for i, s in enumerate(SEVERITIES)}
    out = []
    for f in loud:
        peers = [g for g in loud if g is not f and g.severity == f.severity]
        cost = own(f) + sum(own(g) for g in peers if explains(f, g) and
                            set(causes.get(g.kind, ())) != set(causes.get(f.kind, ())))
        key = (f.kind != "hang", -rank.get(f.severity, -1), -round(cost, 6),
               any(explains(g, f) for g in peers), -float(f.start))
        out.append((key, f, cost))
    out.sort(key=lambda t: t[0])
    return [(f, cost) for _, f, cost in out]


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def headline(seconds: Mapping[str, float] | None, flags: Sequence[Flag], *,
             span: str = f"the last {SPAN_STEPS} steps", finished: RunEnd | None = None,
             suppress: Mapping[str, Iterable[str]] | None = None) -> Headline:
    """The headline of a span: ``seconds`` its GPU-seconds by cause (None: no ledger yet),
    ``flags`` the flags open now (closed ones are ignored), ``finished`` the run's end when
    it has ended, ``suppress`` the config's section (a cause before what it explains)."""
    secs = {c: float((seconds or {}).get(c, 0.0)) for c in CAUSES}
    total = sum(max(v, 0.0) for v in secs.values())
    shares = shares_of(secs)
    goodput = shares.get("productive", 0.0) if total > 0 else None
    lost = sorted(((c, shares[c]) for c in LOST_CAUSES if shares.get(c, 0.0) > 0),
                  key=lambda kv: -kv[1])
    top_loss, top_loss_share = lost[0] if lost else (None, None)
    ranked = [] if finished is not None else rank_open(flags, secs, suppress)
    top, top_share = ranked[0] if ranked else (None, None)
    hang = top is not None and top.kind == "hang"
    causes = _flag_causes()
    naming = [f for f, _ in ranked if top_loss in causes.get(f.kind, ())]
    flagged_as = naming[0].kind if naming and not hang else None
    base = dict(span=span, gpu_seconds=total, goodput=goodput, shares=shares,
                top_loss=top_loss, top_loss_share=top_loss_share, top_flag=top,
                top_flag_share=top_share or None, flagged_as=flagged_as, finished=finished,
                hang=hang, open_flags=len(ranked))
    if finished is not None:
        text = f"Finished {finished.words()}."
        if goodput is not None:
            text += f" Over {span}, goodput was {_pct(goodput)} of the GPU time"
            text += (f"; the largest loss was {top_loss} ({_pct(top_loss_share)})."
                     if top_loss else ".")
        return Headline(state="finished", text=text, **base)
    if hang:
        since = time.strftime("%H:%M:%S", time.gmtime(float(top.start)))
        text = (f"Needs attention: the job is hung (the hang flag, since {since} UTC). The hang "
                "card below says what holds it and what to do; nothing else applies until "
                "steps move again.")
        return Headline(state="critical", text=text, **base)
    if top is not None:
        by_sev = {s: sum(1 for f, _ in ranked if f.severity == s) for s in reversed(SEVERITIES)}
        words = ", ".join(f"{n} {s}" for s, n in by_sev.items() if n)
        text = (f"Needs attention: {len(ranked)} open flag{'s' if len(ranked) > 1 else ''} "
                f"({words}); top problem: {top.kind}")
        if top_share:
            text += f", {_pct(top_share)} of the GPU time of {span}"
        text += "."
        if goodput is not None:
            text += f" Goodput {_pct(goodput)}."
        state = "critical" if any(f.severity == "critical" for f, _ in ranked) else "warning"
        return Headline(state=state, text=text, **base)
    text = "Healthy: no open flag; every detector is quiet."
    if goodput is not None:
        text += f" Goodput {_pct(goodput)} of the GPU time of {span}"
        text += (f"; the largest loss, {top_loss} at {_pct(top_loss_share)}, is for "
                 "information: no detector flags it." if top_loss else ".")
    return Headline(state="healthy", text=text, **base)
