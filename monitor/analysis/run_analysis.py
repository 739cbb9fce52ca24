"""One face over a run's frames and one ``Config``: flags, the goodput ledger, attribution,
pools and the top problem (as HTA's ``TraceAnalysis`` is over its traces).

``analyze``, the exporter's goodput and per-phase collectors, the dashboard and the wandb sink
all ask a :class:`RunAnalysis` built from their frames and the SAME ``Config`` (the user's
``--config`` over ``monitor/defaults.yaml``), so a ``goodput:`` override changes every surface
alike. Each answer is computed once per object and kept. Nothing here draws: the surfaces do.

    ra = RunAnalysis(steps, gpu, host=host, events=events, config=load_config(path))
    ra.flags()            # the detectors' flags (or the ones given: ``flags=``)
    ra.ledger()           # per step and GPU: seconds by cause (monitor/analysis/goodput.py)
    ra.goodput()          # the ``goodput`` object of ``analyze --json``
    ra.attribution()      # per step, phase and GPU activity (monitor/analysis/attribution.py)
    ra.phase_summary()    # per phase and GPU, over the steps
    ra.pools(gpu_ledger)  # the ledger per GPU pool (monitor/analysis/pools.py)
    ra.mode               # the trainer mode and its source (the keys, or the printed config)
    ra.flag_costs()       # each flag's cost in GPU-seconds, largest first
    ra.top_problem()      # the flag to act on first: most severe, then costliest in GPU time
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from monitor.analysis import goodput as G
from monitor.config import Config, Section
from monitor.logs.modes import JudgedMode, judge_mode, printed_mode
from monitor.records import Event, Flag, StepRecord

#: The ledger causes each flag kind names (the cost of a flag is their seconds in its scope).
FLAG_CAUSES: dict[str, tuple[str, ...]] = {
    "io_starvation": ("data_loading",),
    "rollout_long_tail": ("rollout_long_tail",),
    "rollout_wait": ("rollout_long_tail",),
    "generation_tail": ("rollout_long_tail",),
    "gpu_imbalance": ("straggler_wait",),
    "GPUStraggler": ("straggler_wait",),
    "NodeImbalance": ("straggler_wait",),
    "reshard_spike": ("weight_sync", "parameter_sync"),
    "weight_sync_pause": ("weight_sync", "parameter_sync"),
    "comm_heavy": ("communication",),
    "phase_imbalance": ("cpu_phases",),
    "low_utilization": ("low_activity",),
    "util_overstates_sm": ("low_activity",),
    "pool_imbalance": ("waiting_for_samples", "waiting_for_weights"),
    "rollouter_idle": ("waiting_for_weights",),
    "fatal_error": ("restarts",),
    "oom": ("restarts",),
    "stalled": ("restarts",),
}


def config_of(config: Config | None) -> Config:
    """``config``, or the packaged defaults when None."""
    if config is not None:
        return config
    from monitor.config import load_config

    return load_config()


def goodput_settings(config: Config | None) -> Section:
    """The ledger's settings from a whole ``Config`` (its ``goodput:`` section)."""
    return G.settings(config_of(config).section("goodput"))


def flag_steps(flag: Flag, steps: Iterable[int]) -> set[int]:
    """The step numbers a flag covers: its ``steps`` scope, else none."""
    rng = (flag.scope or {}).get("steps")
    if isinstance(rng, (list, tuple)) and len(rng) == 2:
        try:
            lo, hi = int(rng[0]), int(rng[1])
        except (TypeError, ValueError):
            return set()
        return {s for s in steps if lo <= s <= hi}
    return set()


#: Causes booked on the GPUs a flag names (elsewhere the cost is the job's: a straggler's flag
#: names the slow GPU, its cost is its peers' wait).
_LOCAL_CAUSES = frozenset({"low_activity"})


def _in_scope(led: pd.DataFrame, flag: Flag, local: bool = True) -> pd.Series:
    """Rows of the ledger a flag covers: its steps (else its time span) and, when ``local``,
    its node and GPUs."""
    scope = flag.scope or {}
    rows = pd.Series(True, index=led.index)
    covered = flag_steps(flag, led["step"].astype(int).unique())
    if covered:
        rows &= led["step"].astype(int).isin(covered)
    else:
        end = float("inf") if flag.end is None else float(flag.end)
        rows &= (led["end"].astype(float) > float(flag.start)) & (
            led["start"].astype(float) < end)
    if not local:
        return rows
    node = scope.get("node")
    if node is not None and (led["node"].astype(str) == str(node)).any():
        rows &= led["node"].astype(str) == str(node)
    gpus = [int(g) for g in scope.get("gpus") or () if str(g).lstrip("-").isdigit()]
    if gpus and led["gpu"].astype(int).isin(gpus).any():
        rows &= led["gpu"].astype(int).isin(gpus)
    return rows


def flag_costs(flags: Iterable[Flag], led: pd.DataFrame) -> list[dict[str, Any]]:
    """Each flag that names a ledger cause, with the GPU-seconds of that cause in its scope
    (steps, node, GPUs) and their share of the ledger's GPU-seconds; largest first."""
    out: list[dict[str, Any]] = []
    if led is None or len(led) == 0:
        return out
    total = float(led["wall"].sum())
    for flag in flags:
        causes = [c for c in FLAG_CAUSES.get(flag.kind, ()) if c in led.columns]
        if not causes:
            continue
        local = all(c in _LOCAL_CAUSES for c in causes)
        secs = float(led.loc[_in_scope(led, flag, local), causes].to_numpy().sum())
        out.append({"kind": flag.kind, "severity": flag.severity, "scope": dict(flag.scope),
                    "start": flag.start, "end": flag.end, "causes": causes,
                    "gpu_seconds": round(secs, 3),
                    "share": round(secs / total, 4) if total > 0 else None,
                    "evidence": flag.evidence, "advice": list(flag.advice), "flag": flag})
    out.sort(key=lambda d: -d["gpu_seconds"])
    return out


#: Cross-node alerts read as the flag kind behind them (``dashboards.sources.alerts``).
_BASE_KIND: dict[str, str] = {"GPUStraggler": "gpu_imbalance", "NodeImbalance": "gpu_imbalance"}


def _entry(flag: Flag, causes: list[str], secs: float | None, total: float) -> dict[str, Any]:
    return {"kind": flag.kind, "severity": flag.severity, "scope": dict(flag.scope),
            "start": flag.start, "end": flag.end, "causes": causes,
            "gpu_seconds": None if secs is None else round(secs, 3),
            "share": round(secs / total, 4) if secs is not None and total > 0 else None,
            "evidence": flag.evidence, "advice": list(flag.advice), "flag": flag}


def rank_problems(flags: list[Flag], led: pd.DataFrame,
                  suppress: Mapping[str, Iterable[str]] | None = None) -> list[dict[str, Any]]:
    """Every flag as a :func:`flag_costs` entry (``gpu_seconds`` None where it names no
    ledger cause), in the order to act on them: most severe first; within a severity the
    largest cost in GPU time, a flag counting the costs of the flags it explains (``suppress``
    of the config: a straggler explains its waiting peers' low activity); then a cause before
    what it explains, then the newest."""
    from monitor.records import SEVERITIES

    rules = {k: set(v or ()) for k, v in (suppress or {}).items()}
    costed = {id(c["flag"]): c for c in flag_costs(flags, led)}
    total = float(led["wall"].sum()) if led is not None and len(led) else 0.0

    def explains(a: Flag, b: Flag) -> bool:
        return _BASE_KIND.get(a.kind, a.kind) in rules.get(_BASE_KIND.get(b.kind, b.kind), ())

    own = {id(f): (costed[id(f)]["gpu_seconds"] if id(f) in costed else 0.0) for f in flags}
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    out = []
    for f in flags:
        peers = [g for g in flags if g is not f and g.severity == f.severity]
        secs = own[id(f)] + sum(own[id(g)] for g in peers if explains(f, g))
        known = id(f) in costed or any(id(g) in costed for g in peers if explains(f, g))
        entry = _entry(f, costed[id(f)]["causes"] if id(f) in costed else [],
                       secs if known else None, total)
        entry["_key"] = (-rank.get(f.severity, -1), -secs, any(explains(g, f) for g in peers),
                         -float(f.start))
        out.append(entry)
    out.sort(key=lambda e: e["_key"])
    for e in out:
        del e["_key"]
    return out


def top_problem(flags: list[Flag], led: pd.DataFrame,
                suppress: Mapping[str, Iterable[str]] | None = None) -> dict[str, Any] | None:
    """The flag to act on first (:func:`rank_problems`' first), None without a flag. Its
    ``flag`` is the Flag itself; ``json_top`` drops it for JSON."""
    ranked = rank_problems(flags, led, suppress)
    return ranked[0] if ranked else None


def json_top(top: dict[str, Any] | None) -> dict[str, Any] | None:
    """``top_problem``'s entry without the Flag object (for ``analyze --json``)."""
    return None if top is None else {k: v for k, v in top.items() if k != "flag"}


class RunAnalysis:
    """Every analysis of one run's frames under one ``Config``; each computed once.

    ``steps``, ``gpu`` (GPU samples; None or empty without them), ``host``, ``events``,
    ``nccl``, ``rollout``: the frames. ``config``: the whole ``Config`` (default: the packaged
    defaults). ``flags``: flags already known (the live tracker's, the store's), used instead of
    running the detectors. ``now``/``reference_steps``: as for ``monitor.detect.run_all``.
    ``job_config``: the job's config as verl printed it (``monitor.logs.job_config``), None
    when the log has none: its trainer mode decides where the step keys cannot tell one, and
    the detectors' premises read it. ``actors``: the Ray actor names the log's prefixes showed.
    """

    def __init__(self, steps: list[StepRecord], gpu: pd.DataFrame | None = None, *,
                 host: pd.DataFrame | None = None, events: list[Event] | None = None,
                 nccl: pd.DataFrame | None = None, rollout: pd.DataFrame | None = None,
                 config: Config | None = None, flags: list[Flag] | None = None,
                 now: float | None = None,
                 reference_steps: list[StepRecord] | None = None,
                 job_config: Mapping[str, Any] | None = None,
                 actors: Iterable[str] = ()) -> None:
        self.steps = list(steps)
        self.gpu = gpu
        self.host = host
        self.events = list(events or [])
        self.nccl = nccl
        self.rollout = rollout
        self.config = config_of(config)
        self.now = now
        self.reference_steps = reference_steps
        self._flags = None if flags is None else list(flags)
        self.job_config = job_config
        self.actors = frozenset(actors)
        #: every premise the detectors judged (``premises()``), filled by ``flags()``
        self._judged: list[Any] = []

    @property
    def has_gpu(self) -> bool:
        """Whether there are GPU samples to judge."""
        return self.gpu is not None and len(self.gpu) > 0

    @functools.cached_property
    def mode(self) -> JudgedMode:
        """The run's trainer mode and where it came from: the step keys, or the printed
        config where the keys are the same for every trainer (``judge_mode``)."""
        return judge_mode(self.steps, printed_mode(self.job_config))

    @functools.cached_property
    def goodput_config(self) -> Section:
        """The ledger's settings (the ``goodput:`` section over the built-in values)."""
        return G.settings(self.config.section("goodput"))

    def flags(self) -> list[Flag]:
        """The flags given, else the detectors' on the frames (``run_all``)."""
        if self._flags is None:
            from monitor.detect import run_all  # the detectors sit above the analyses
            from monitor.frames import empty_gpu_frame, empty_host_frame

            gpu = self.gpu if self.gpu is not None else empty_gpu_frame()
            host = self.host if self.host is not None else empty_host_frame()
            self._flags = run_all(self.steps, gpu, host, self.events, config=self.config,
                                  now=self.now, reference_steps=self.reference_steps,
                                  nccl=self.nccl, rollout=self.rollout,
                                  printed_mode=printed_mode(self.job_config),
                                  job_config=self.job_config, actors=self.actors,
                                  judged=self._judged)
        return self._flags

    def premises(self) -> list[dict[str, Any]]:
        """The premises that stopped a reading on this job (failed, or could not be judged),
        with why: the report's "not judged" list (empty when the flags were given)."""
        from monitor.detect.premises import not_holding

        self.flags()
        return [j.to_dict() for j in not_holding(self._judged)]

    def tail_flagged_steps(self) -> set[int]:
        """Steps a ``rollout_long_tail`` flag covers (the ledger books their gen loss as the
        tail: the same cause for the same steps on the Flags page and in the ledger)."""
        nums = {int(s.step) for s in self.steps}
        out: set[int] = set()
        for f in self.flags():
            if f.kind == "rollout_long_tail":
                out |= flag_steps(f, nums)
        return out

    def ledger_kwargs(self) -> dict[str, Any]:
        """What every ledger of this run is given besides the frames: the settings, the tail
        evidence, the flagged tail steps and the trainer mode."""
        return {"config": self.goodput_config,
                "tail_steps": G.tail_evidence(self.steps, self.goodput_config),
                "flagged_tail": self.tail_flagged_steps(), "mode": self.mode.mode}

    @functools.lru_cache(maxsize=4)  # noqa: B019 - one object per analysis, a few run ends
    def ledger(self, run_end: float | None = None) -> pd.DataFrame:
        """The goodput ledger per step and GPU (empty without GPU samples); ``run_end``
        defaults to the last crash logged after the last step (``goodput.crash_end``)."""
        if not self.has_gpu:
            return pd.DataFrame(columns=G.LEDGER_COLUMNS)
        if run_end is None:
            run_end = G.crash_end(self.steps, self.events)
        return G.ledger(self.steps, self.gpu, self.events, run_end=run_end,
                        **self.ledger_kwargs())

    def goodput(self, gpu_hour_cost: float | None = None) -> dict[str, Any] | None:
        """The ``goodput`` object of ``analyze --json`` (None without GPU samples)."""
        if not self.has_gpu:
            return None
        return G.document(self.steps, self.gpu, self.events, gpu_hour_cost=gpu_hour_cost,
                          led=self.ledger())

    def attribution(self) -> pd.DataFrame:
        """Per step, phase and GPU: util and SM activity (``attribute``)."""
        from monitor.analysis.attribution import attribute

        return attribute(self.steps, self.gpu, self.events) if self.has_gpu else attribute(
            self.steps, None)

    def phase_summary(self) -> pd.DataFrame:
        """Per phase and GPU over the steps, with the withheld phases (``phase_summary``,
        ``dashboard.phase_min_samples`` of this config)."""
        from monitor.analysis.attribution import DEFAULT_MIN_PHASE_SAMPLES, phase_summary

        return phase_summary(self.attribution(), self.config.get_int(
            "dashboard.phase_min_samples", DEFAULT_MIN_PHASE_SAMPLES))

    def pools(self, gpu_ledger: dict[str, Any] | None = None, *,
              trainer_gpus: int | None = None, rollout_gpus: int | None = None
              ) -> dict[str, Any]:
        """The ledger per GPU pool (``monitor.analysis.pools.document``)."""
        from monitor.analysis.pools import document

        return document(self.steps, rollout=self.rollout, gpu_ledger=gpu_ledger,
                        trainer_gpus=trainer_gpus, rollout_gpus=rollout_gpus,
                        mode=self.mode.mode)

    def flag_costs(self, run_end: float | None = None) -> list[dict[str, Any]]:
        """Each flag's cost in GPU-seconds of the causes it names, largest first."""
        return flag_costs(self.flags(), self.ledger(run_end))

    def top_problem(self, run_end: float | None = None) -> dict[str, Any] | None:
        """The flag to act on first: the most severe, then the costliest in GPU time (see
        :func:`rank_problems`)."""
        return top_problem(self.flags(), self.ledger(run_end), self.config.section("suppress"))
