"""A verl-shaped job's timeline in simulated time: where its driver and worker are each second.

For the hang tests and ``bench/hang_latency.py``: steps of verl's phases (data, a generation the
GPUs compute, a reward, log-probs, the update), a validation and a checkpoint between some
steps, and a fault (a reward that never returns) from a given step on. :class:`JobTimeline`
answers, for any time, what py-spy would find (``where.Where`` of the driver and a worker, the
node's verdict), the steps that ended so far (``StepRecord`` with verl's timers) and a GPU
sample frame; nothing sleeps, so a run of 100-second steps plays in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from monitor.hang.dump import Frame
from monitor.hang.stacks import StackRound
from monitor.hang.where import (
    CHECKPOINT,
    GENERATION,
    KERNEL,
    REWARD,
    WORKER_CALL,
    Where,
    judge,
)
from monitor.records import StepRecord

DRIVER_PID, WORKER_PID = 1001, 1002
_FIT = "verl/trainer/ppo/ray_trainer.py"
#: verl's phases of one step: (phase, seconds) in order.
STEP_PHASES: tuple[tuple[str, float], ...] = (
    ("gen", 90.0), ("reward", 0.8), ("old_log_prob", 6.0), ("update_actor", 12.0))
#: Phases whose GPUs compute.
_BUSY = frozenset(("gen", "old_log_prob", "update_actor", "testing"))


@dataclass(frozen=True)
class Segment:
    """One stretch of the run: [start, end), the phase, the step it belongs to."""

    start: float
    end: float
    phase: str
    step: int


@dataclass
class JobTimeline:
    """The run: ``steps`` steps of ``STEP_PHASES``, a validation of ``validation_s`` in step
    ``validation_step``, a checkpoint of ``checkpoint_s`` in step ``checkpoint_step``, and a
    reward that never returns from step ``block_step`` on (0: none). Times from ``t0``."""

    steps: int = 8
    t0: float = 1_800_000_000.0
    validation_step: int = 3
    validation_s: float = 180.0
    checkpoint_step: int = 4
    checkpoint_s: float = 120.0
    block_step: int = 6
    phases: tuple[tuple[str, float], ...] = STEP_PHASES
    segments: list[Segment] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    blocked_at: float | None = None

    def __post_init__(self) -> None:
        t = self.t0
        for n in range(1, self.steps + 1):
            timers: dict[str, float] = {}
            start = t
            for phase, secs in self.phases:
                if phase == "reward" and n == self.block_step:
                    self.blocked_at = t
                    self.segments.append(Segment(t, float("inf"), "blocked", n))
                    return
                self.segments.append(Segment(t, t + secs, phase, n))
                timers[phase] = secs
                t += secs
            for step, phase, secs in ((self.validation_step, "testing", self.validation_s),
                                      (self.checkpoint_step, "save_checkpoint",
                                       self.checkpoint_s)):
                if n == step:
                    self.segments.append(Segment(t, t + secs, phase, n))
                    timers[phase] = secs
                    t += secs
            self.records.append(StepRecord(n, end_time=t, total=t - start, phases=timers,
                                           time_source="line"))

    @property
    def end(self) -> float:
        """When the last segment ends (the block: never)."""
        return self.segments[-1].end

    def segment_at(self, t: float) -> Segment | None:
        """The stretch running at ``t``."""
        for s in self.segments:
            if s.start <= t < s.end:
                return s
        return None

    def steps_until(self, t: float) -> list[StepRecord]:
        """The steps that ended by ``t``."""
        return [r for r in self.records if float(r.end_time) <= t]

    def wheres(self, t: float) -> tuple[Where, Where]:
        """What py-spy finds at ``t``: (the driver, the worker)."""
        s = self.segment_at(t)
        phase = s.phase if s is not None else "done"
        worker_idle = Where(WORKER_PID, "worker", "ray_idle")
        if phase in ("reward", "blocked"):
            fr = Frame("compute_score", "user_reward.py", 10) if phase == "reward" else \
                Frame("normalize_final_answer", "user_reward.py", 5)
            return Where(DRIVER_PID, "driver", REWARD, "reward", fr), worker_idle
        line = {"gen": 1000, "old_log_prob": 1050, "update_actor": 1100}.get(phase, 900)
        if phase == "testing":
            call = Where(DRIVER_PID, "driver", WORKER_CALL, "testing",
                         Frame("RayPPOTrainer._validate", _FIT, 600))
            return call, Where(WORKER_PID, "worker", GENERATION, "gen",
                               Frame("generate_sequences", "verl/workers/fsdp_workers.py", 1))
        if phase == "save_checkpoint":
            call = Where(DRIVER_PID, "driver", WORKER_CALL, "",
                         Frame("RayPPOTrainer._save_checkpoint", _FIT, 700))
            return call, Where(WORKER_PID, "worker", CHECKPOINT, "save_checkpoint",
                               Frame("save_checkpoint",
                                     "verl/utils/checkpoint/checkpoint_manager.py", 3))
        call = Where(DRIVER_PID, "driver", WORKER_CALL, "", Frame("RayPPOTrainer.fit", _FIT,
                                                                  line))
        place = GENERATION if phase == "gen" else KERNEL
        return call, Where(WORKER_PID, "worker", place, phase,
                           Frame("forward", "verl/workers/actor/dp_actor.py", 5))

    def round(self, t: float, full: bool = True, node: str = "n0") -> StackRound:
        """A py-spy round at ``t`` on ``node``: the driver's dump, and the worker's when
        ``full``."""
        driver, worker = (replace(w, node=node) for w in self.wheres(t))
        wheres = [driver, worker] if full else [driver]
        return StackRound(wheres=wheres, verdict=judge(wheres))

    def gpu_frame(self, until: float, interval: float = 1.0, node: str = "n0") -> pd.DataFrame:
        """One GPU's samples from ``t0`` to ``until``: busy while its phase computes."""
        ts = np.arange(self.t0, until, interval)
        busy = np.array([(s := self.segment_at(float(t))) is not None and s.phase in _BUSY
                         for t in ts])
        return pd.DataFrame({"ts": ts, "node": node, "gpu": 0,
                             "util": np.where(busy, 98.0, 0.0),
                             "sm_active": np.where(busy, 70.0, 0.0)})
