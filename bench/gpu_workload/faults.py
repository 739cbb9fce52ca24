"""The faults the workload can inject, each a real cause (never a sleep inside a phase timer).

Every scenario names what it does, on which steps and ranks, and what a correct monitor should
say about it (``expect``: flag kinds, any one of which is a correct diagnosis, and the scope it
must name). ``bench/gpu_scenarios.py`` writes this into each run's ``truth.json`` and scores
the flags against it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One run of the workload: a fault (or none), where and when it acts, what should be said."""

    name: str
    what: str
    #: first and last step (inclusive) the fault acts on; None for the healthy run
    steps: tuple[int, int] | None = None
    #: rank the fault acts on (None: the driver / all ranks)
    rank: int | None = None
    #: flag kinds any of which is a right diagnosis (empty: nothing warning or critical)
    expect: tuple[str, ...] = ()
    #: scope the flag must name: "gpu" (the faulty rank's GPU), "phase" (a phase name)
    expect_scope: dict[str, Any] = field(default_factory=dict)
    #: fewest GPUs the fault needs to exist at all
    min_gpus: int = 1
    #: the job ends with the fault (OOM, NCCL hang)
    fatal: bool = False
    #: kinds that are true consequences of the fault, not false alarms (with the reason)
    also: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for truth.json."""
        return asdict(self)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "no fault"),
    Scenario("data_stall", "the driver's DataLoader does ~5 s of CPU work per batch in the main "
             "process before the step timer starts", steps=(4, 7),
             expect=("io_starvation",)),
    Scenario("straggler", "one rank does 2.5x the update work (extra bf16 matmuls) while its "
             "peers wait in the gradient all-reduce", steps=(4, 7), rank=-1,
             expect=("gpu_imbalance", "straggler"), expect_scope={"gpu": "rank", "phase": "update_actor"},
             min_gpus=2),
    Scenario("contention", "a second process runs bf16 matmuls on one rank's GPU, slowing "
             "every phase there", steps=(4, 7), rank=-1,
             expect=("gpu_imbalance", "straggler", "throughput_regression", "step_time_spikes"),
             expect_scope={"gpu": "rank"}),
    Scenario("slow_sync", "the weight sync goes through host memory tensor by tensor",
             steps=(4, 7), expect=("reshard_spike",), expect_scope={"phase": "reshard"}),
    Scenario("long_tail", "a few prompts on one rank are forced to the maximum response length",
             steps=(4, 7), rank=0, expect=("rollout_long_tail",), expect_scope={"phase": "gen"},
             # the long responses are padded into that rank's update batch: it gets up to 58%
             # more tokens (global_seqlen) and the other rank waits for it in the all-reduce
             also=("gpu_imbalance",)),
    Scenario("oom", "the update keeps ~24 GiB more each step until CUDA runs out of memory",
             steps=(4, 99), rank=0, expect=("oom", "memory_pressure"), fatal=True),
    Scenario("nccl_hang", "one rank stalls before the gradient all-reduce past the process "
             "group's 30 s timeout: the NCCL watchdog ends the job", steps=(4, 4), rank=-1,
             expect=("fatal_error", "stalled"), min_gpus=2, fatal=True),
    Scenario("big_collectives", "every update all-reduces an extra 2 GiB buffer for ~2 s",
             steps=(4, 7), expect=("comm_heavy",), min_gpus=2,
             # SM activity in the training phases really is 41-44% (the update waits on the
             # all-reduces): live, low_utilization can open a step before comm_heavy names why
             also=("low_utilization",)),
    Scenario("tiny_micro", "log-prob and update passes run one sequence per micro-batch",
             steps=(4, 7), expect=("low_utilization", "util_overstates_sm")),
    # issue 23: faults the original detectors were not built for
    Scenario("cpu_reward", "the reward function scores each response in pure Python on one "
             "CPU core (~4 s a step) while every GPU waits", steps=(4, 7),
             expect=("phase_imbalance",), expect_scope={"phase": "reward"}),
    Scenario("offload", "each log-prob pass first moves 4 GiB of parameters from pageable host "
             "memory to the GPU and back (parameter offload)", steps=(4, 7),
             expect=("phase_imbalance", "low_utilization")),
    Scenario("memory_creep", "the update keeps ~16 GiB more GPU memory every step, up to near "
             "capacity, without running out", steps=(3, 9), rank=0,
             expect=("memory_creep", "memory_pressure")),
)}


def active(scn: Scenario, step: int) -> bool:
    """Whether the scenario's fault acts on ``step``."""
    return scn.steps is not None and scn.steps[0] <= step <= scn.steps[1]


def fault_rank(scn: Scenario, world: int) -> int | None:
    """The rank the fault acts on in a job of ``world`` ranks (-1 means the last rank)."""
    if scn.rank is None:
        return None
    return scn.rank % world
