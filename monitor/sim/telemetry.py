"""GPU and host telemetry of a simulated run, sampled at any instant.

The run is a flat timeline of segments (a phase, a host-side gap, idle time before or after
the run). Each segment label has a GPU signature (util, SM activity, tensor and DRAM activity,
SM occupancy, all 0-100) and a memory level; the step's :class:`~monitor.sim.scenarios.StepPlan`
bends it per GPU. Noise is read from fixed tables indexed by time, so a sample depends only on
``t``: the same instant always reads the same, and a sample costs a few microseconds per GPU.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

from monitor.sim.scenarios import BUSY_PHASES, TRAINING_TIMELINE, StepPlan

#: H200: 141 GB (NVML total of the real card).
MEM_TOTAL_BYTES = 150_754_820_096
SM_CLOCK_HZ = 1_980_000_000.0
THROTTLED_CLOCK_HZ = 1_410_000_000.0

#: label -> (util, sm_active, tensor_active, dram_active, sm_occupancy), healthy means.
GPU_SIGNATURES: dict[str, tuple[float, float, float, float, float]] = {
    "idle": (2.0, 1.0, 0.5, 1.0, 0.0),
    "gap": (3.0, 1.5, 0.5, 1.5, 0.5),
    # the batch fetch before the step timer: GPUs idle (verl's workers wait for the driver)
    "data_wait": (2.0, 1.0, 0.5, 1.0, 0.0),
    # a fully-async trainer waiting for samples from the rollouter's queue: its GPUs idle
    "wait_samples": (2.0, 1.0, 0.5, 1.0, 0.0),
    "gen": (94.0, 58.0, 22.0, 65.0, 34.0),
    "reward": (12.0, 6.0, 2.0, 4.0, 2.0),
    "adv": (8.0, 3.0, 1.0, 2.0, 1.0),
    "old_log_prob": (90.0, 80.0, 62.0, 40.0, 16.0),
    "ref": (90.0, 79.0, 61.0, 40.0, 16.0),
    "values": (90.0, 77.0, 58.0, 42.0, 15.0),
    "update_critic": (95.0, 84.0, 71.0, 31.0, 18.0),
    "update_actor": (95.0, 85.0, 73.0, 30.0, 18.0),
    "comm": (88.0, 15.0, 1.0, 24.0, 6.0),
    "reshard": (45.0, 12.0, 1.0, 35.0, 5.0),
    "rollout_wait": (3.0, 1.5, 0.5, 1.0, 0.5),
    "testing": (93.0, 56.0, 20.0, 62.0, 30.0),
    "save_checkpoint": (6.0, 2.0, 0.0, 8.0, 1.0),
    "stalled": (0.0, 0.0, 0.0, 0.0, 0.0),
    "hung": (100.0, 2.0, 0.0, 1.0, 1.0),  # ranks spinning in NCCL for a peer that never came
    "exited": (0.0, 0.0, 0.0, 0.0, 0.0),
}
#: Resident memory of the simulated training process tree on each node (bytes).
TRAIN_RSS_BYTES = 24.0 * 2**30
#: Memory share of the total per label (gaps keep the previous phase's level).
MEM_LEVELS: dict[str, float] = {
    "idle": 0.62,
    "wait_samples": 0.6,
    "gen": 0.72,
    "reward": 0.70,
    "adv": 0.62,
    "old_log_prob": 0.60,
    "ref": 0.61,
    "values": 0.62,
    "update_critic": 0.68,
    "update_actor": 0.74,
    "comm": 0.74,
    "reshard": 0.72,
    "rollout_wait": 0.72,
    "testing": 0.72,
    "save_checkpoint": 0.66,
    "stalled": 0.70,
    "hung": 0.72,
    "exited": 0.0,
}
#: label -> (cpu_avg, cpu_max_core, iowait, disk_read_bps), healthy means per node.
HOST_SIGNATURES: dict[str, tuple[float, float, float, float]] = {
    "idle": (3.0, 12.0, 0.3, 0.3e6),
    "gap": (9.0, 58.0, 1.2, 90e6),
    # the driver's core busy fetching and collating the batch (measured ~100% on the H200 host)
    "data_wait": (9.0, 99.5, 1.0, 38e6),
    "wait_samples": (5.0, 30.0, 0.3, 0.5e6),
    "gen": (16.0, 68.0, 0.4, 2e6),
    "reward": (28.0, 88.0, 0.5, 1e6),
    "adv": (8.0, 50.0, 0.3, 0.5e6),
    "old_log_prob": (10.0, 45.0, 0.3, 1e6),
    "ref": (10.0, 45.0, 0.3, 1e6),
    "values": (10.0, 45.0, 0.3, 1e6),
    "update_critic": (11.0, 48.0, 0.3, 1e6),
    "update_actor": (11.0, 48.0, 0.3, 1e6),
    "comm": (8.0, 40.0, 0.3, 0.5e6),
    "reshard": (12.0, 60.0, 0.3, 1e6),
    "rollout_wait": (6.0, 30.0, 0.3, 0.5e6),
    "testing": (16.0, 68.0, 0.4, 2e6),
    "save_checkpoint": (12.0, 55.0, 4.0, 5e6),
    "stalled": (2.5, 10.0, 0.2, 0.1e6),
    "hung": (2.5, 10.0, 0.2, 0.1e6),
    "exited": (1.5, 6.0, 0.1, 0.1e6),
}

_TABLE_BITS = 16
_MASK = (1 << _TABLE_BITS) - 1  # one shared table of normal noise, hashed by (time, gpu, channel)
_GOLDEN = 2654435761  # Knuth's multiplicative hash: no visible period in the noise


def _hash_time(k: int) -> int:
    return ((k * _GOLDEN) & 0xFFFFFFFF) >> 8


def power_of(util: float, sm: float, tensor: float) -> float:
    """Board power (W) for an activity mix: ~90 W idle to ~630 W busy."""
    return min(700.0, 85.0 + 6.5 * (0.25 * util + 0.45 * sm + 0.30 * tensor))


@dataclass
class Segment:
    """One piece of the timeline: a phase (or gap) of a step, or idle time."""

    start: float
    end: float
    label: str
    step_index: int | None
    plan: StepPlan | None
    mem: float


class Telemetry:
    """Samples GPUs and hosts of one simulated run at any instant (deterministic per seed)."""

    def __init__(
        self,
        segments: list[Segment],
        nodes: list[str],
        gpus_per_node: int,
        seed: int,
        noise: float,
        xid_events: list[tuple[float, int, int]],
        down: dict[int, float],
    ) -> None:
        self.segments = segments
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.n_gpus = len(nodes) * gpus_per_node
        self.noise = float(noise)
        self.xid_events = sorted(xid_events)
        self.down = dict(down)
        #: GPUs whose rank stopped before the collective in a ``hung`` segment (idle; the others
        #: spin in the collective)
        self.hang_idle: set[int] = set()
        rng = np.random.default_rng(np.random.SeedSequence([seed, 7001]))
        self._tab = rng.standard_normal(_MASK + 1).tolist()
        # static per-GPU offsets (util, sm, tensor, dram, mem share, power factor)
        self._off = rng.standard_normal((6, self.n_gpus)).tolist()
        self._starts = [s.start for s in segments]
        self._energy0: list[float] = []
        acc = 0.0
        for seg in segments:
            self._energy0.append(acc)
            u, sm, te, _d, _o = GPU_SIGNATURES[seg.label]
            acc += power_of(u, sm, te) * (seg.end - seg.start)
        self._energy_end = acc

    # -- lookup -------------------------------------------------------------------------
    def segment_at(self, t: float) -> Segment | None:
        """The timeline segment containing ``t`` (None before the run or after its end)."""
        i = bisect_right(self._starts, t) - 1
        if i < 0:
            return None
        seg = self.segments[i]
        if t >= seg.end and i == len(self.segments) - 1:
            return None
        return seg

    def _energy_base(self, t: float) -> float:
        if not self.segments:
            return 0.0
        first = self.segments[0]
        idle_w = power_of(*GPU_SIGNATURES["idle"][:3])
        i = bisect_right(self._starts, t) - 1
        if i < 0:
            return max(0.0, 5.0e6 + idle_w * (t - first.start))
        seg = self.segments[i]
        if t >= seg.end:
            after = GPU_SIGNATURES["exited" if seg.label == "exited" else "idle"]
            return 5.0e6 + self._energy_end + power_of(*after[:3]) * (t - seg.end)
        u, sm, te, _d, _o = GPU_SIGNATURES[seg.label]
        return 5.0e6 + self._energy0[i] + power_of(u, sm, te) * (t - seg.start)

    # -- GPUs ---------------------------------------------------------------------------
    def gpu_sample_at(self, t: float) -> list[dict[str, Any]]:
        """One dict per (node, gpu): interchange columns plus the exporter's extras."""
        seg = self.segment_at(t)
        label = "idle" if seg is None else seg.label
        if seg is None and self.segments and t >= self.segments[-1].end:
            last = self.segments[-1].label
            label = last if last in ("exited", "stalled", "hung") else "idle"
        plan = seg.plan if seg is not None else None
        mem_level = seg.mem if seg is not None else MEM_LEVELS[label]
        if seg is None and label == "idle" and self.segments and t >= self.segments[-1].end:
            mem_level = 0.0  # a finished run frees its memory
        base = GPU_SIGNATURES[label]
        frac = 0.0
        if seg is not None and seg.end > seg.start:
            frac = (t - seg.start) / (seg.end - seg.start)
        busy = label in BUSY_PHASES
        training = label in TRAINING_TIMELINE
        trough = False
        if plan is not None and plan.troughs > 0 and busy:
            pos = ((t - seg.start) % plan.trough_period) / plan.trough_period
            trough = pos < plan.troughs
        if label == "reshard" and plan is not None and frac < 0.75:
            mem_level = plan.reshard_peak
        if plan is not None:
            if training and plan.mem_train is not None:
                mem_level = plan.mem_train - (0.74 - MEM_LEVELS[label]) * 0.3
            elif label in ("gen", "rollout_wait", "reward") and plan.mem_gen is not None:
                mem_level = plan.mem_gen
        hk = _hash_time(int(math.floor(t * 4.0)))
        hk2 = _hash_time(int(math.floor(t * 0.25)) + 977)
        tab = self._tab
        off = self._off
        amp = self.noise
        energy_base = self._energy_base(t)
        out: list[dict[str, Any]] = []
        idle_sig = GPU_SIGNATURES["gap"]
        for g in range(self.n_gpus):
            gh = g * 7919
            node = self.nodes[g // self.gpus_per_node]
            idx = g % self.gpus_per_node
            down_at = self.down.get(g)
            xid = {}
            if self.xid_events:
                for te, ge, code in self.xid_events:
                    if te > t:
                        break
                    if ge == g:
                        xid[code] = xid.get(code, 0) + 1
            if down_at is not None and t >= down_at:
                out.append(_down_row(t, node, idx, xid))
                continue
            u, sm, te, dr, occ = base
            if label == "hung" and g in self.hang_idle:
                u, sm, te, dr, occ = GPU_SIGNATURES["stalled"]
            if busy:
                if trough or (label == "gen" and plan is not None and frac > plan.gen_finish[g]):
                    u, sm, te, dr, occ = idle_sig
                else:
                    if training and plan is not None:
                        if plan.training_override is not None:
                            u, sm, te, dr = plan.training_override
                            occ = 8.0
                        elif plan.training_scale is not None:
                            fu, fs, ft = plan.training_scale
                            u, sm, te = u * fu, sm * fs, te * ft
                    if label == "gen" and plan is not None and plan.gen_scale is not None:
                        fu, fs, fd = plan.gen_scale
                        u, sm, dr = u * fu, sm * fs, dr * fd
                    if label == "gen" and plan is not None and plan.gen_thin is not None and (
                            frac > plan.gen_thin[0]):
                        u, sm = u * plan.gen_thin[1], sm * plan.gen_thin[2]
                    if plan is not None and g in plan.gpu_factor and (
                            plan.gpu_factor_phases is None or label in plan.gpu_factor_phases):
                        fu, fs, ft = plan.gpu_factor[g]
                        u, sm, te, occ = u * fu, sm * fs, te * ft, occ * fs
                    u += amp * (1.0 * off[0][g] + 1.5 * tab[(hk + gh) & _MASK])
                    sm += amp * (2.5 * off[1][g] + 3.0 * tab[(hk + gh + 104729) & _MASK])
                    te += amp * (2.5 * off[2][g] + 3.0 * tab[(hk + gh + 209458) & _MASK])
                    dr += amp * (2.0 * off[3][g] + 3.0 * tab[(hk + gh + 314187) & _MASK])
                    occ += amp * 2.0 * tab[(hk + gh + 418916) & _MASK]
            else:
                u += amp * 1.2 * abs(tab[(hk + gh) & _MASK])
                sm += amp * 1.0 * abs(tab[(hk + gh + 104729) & _MASK])
                te += amp * 0.4 * abs(tab[(hk + gh + 209458) & _MASK])
                dr += amp * 0.8 * abs(tab[(hk + gh + 314187) & _MASK])
            u = 100.0 if u > 100.0 else (0.0 if u < 0.0 else u)
            sm = u if sm > u else (0.0 if sm < 0.0 else sm)
            te = sm if te > sm else (0.0 if te < 0.0 else te)
            dr = 100.0 if dr > 100.0 else (0.0 if dr < 0.0 else dr)
            occ = sm if occ > sm else (0.0 if occ < 0.0 else occ)
            mem = mem_level
            if mem > 0:
                mem = mem + amp * (0.012 * off[4][g] + 0.003 * tab[(hk2 + gh + 523645) & _MASK])
                mem = 0.999 if mem > 0.999 else (0.005 if mem < 0.005 else mem)
            power = power_of(u, sm, te) * (1.0 + 0.03 * amp * off[5][g])
            power += amp * 6.0 * tab[(hk + gh + 628374) & _MASK]
            power = max(60.0, power)
            temp = 33.0 + 0.065 * power + amp * 0.8 * tab[(hk2 + gh + 733103) & _MASK]
            thermal = plan is not None and g in plan.thermal_gpus and busy
            clock = SM_CLOCK_HZ + amp * 4.0e6 * tab[(hk + gh + 733103) & _MASK]
            if thermal:
                temp = 89.0 + amp * 1.5 * abs(tab[(hk + gh + 733103) & _MASK])
                clock = THROTTLED_CLOCK_HZ + amp * 15.0e6 * tab[(hk + gh + 628374) & _MASK]
            comm = label == "comm"
            out.append(
                {
                    "ts": t,
                    "node": node,
                    "gpu": idx,
                    "util": u,
                    "sm_active": sm,
                    "mem_used_bytes": mem * MEM_TOTAL_BYTES,
                    "mem_total_bytes": MEM_TOTAL_BYTES,
                    "power_w": power,
                    "tensor_active": te,
                    "dram_active": dr,
                    "sm_occupancy": occ,
                    "temperature_c": temp,
                    "sm_clock_hz": clock,
                    "energy_j": energy_base * (1.0 + 0.03 * amp * off[5][g]),
                    "up": True,
                    "xid": xid,
                    "clock_events": {
                        "gpu_idle": u < 5.0,
                        "sw_power_cap": power > 650.0,
                        "hw_slowdown": thermal,
                        "hw_thermal_slowdown": thermal,
                        "sw_thermal_slowdown": thermal,
                    },
                    "pcie_tx_bps": (2.0e9 if label == "reshard" else 0.2e9) * (u / 100.0),
                    "pcie_rx_bps": (2.5e9 if label in ("reshard", "gap") else 0.3e9) * (u / 100),
                    "nvlink_tx_bps": (180e9 if comm else 12e9 if busy else 1e6) * (u / 100.0),
                    "nvlink_rx_bps": (180e9 if comm else 12e9 if busy else 1e6) * (u / 100.0),
                }
            )
        return out

    # -- hosts --------------------------------------------------------------------------
    def host_sample_at(self, t: float, node: str) -> dict[str, Any]:
        """CPU and disk of one node at ``t`` (``monitor.frames.HOST_COLUMNS``)."""
        try:
            n = self.nodes.index(node)
        except ValueError as exc:
            raise KeyError(f"unknown node {node!r}; nodes: {', '.join(self.nodes)}") from exc
        seg = self.segment_at(t)
        label = "idle" if seg is None else seg.label
        if seg is None and self.segments and t >= self.segments[-1].end:
            last = self.segments[-1].label
            label = last if last in ("exited", "stalled", "hung") else "idle"
        avg, mx, iow, disk = HOST_SIGNATURES[label]
        plan = seg.plan if seg is not None else None
        if plan is not None and plan.host:
            mx = plan.host.get("cpu_max", mx)
            iow = plan.host.get("iowait", iow)
            disk = plan.host.get("disk_bps", disk)
            avg = plan.host.get("cpu_avg", avg)
        hk = _hash_time(int(math.floor(t * 2.0)) + 31) + 7919 * 4099 * (n + 1)
        tab = self._tab
        amp = self.noise
        avg = max(0.0, avg + amp * 1.5 * tab[hk & _MASK])
        mx = min(100.0, max(avg, mx + amp * 5.0 * tab[(hk + 104729) & _MASK]))
        if plan is not None and plan.host.get("cpu_max", 0) >= 99:
            mx = min(100.0, 99.0 + amp * 0.8 * abs(tab[(hk + 104729) & _MASK]))
        iow = max(0.0, iow * (1.0 + amp * 0.25 * tab[(hk + 209458) & _MASK]))
        disk = max(0.0, disk * (1.0 + amp * 0.2 * tab[(hk + 314187) & _MASK]))
        return {
            "ts": t,
            "node": node,
            "cpu_max_core_pct": mx,
            "cpu_avg_pct": avg,
            "iowait_pct": iow,
            "disk_read_bps": disk,
            # the training process tree's RSS: flat unless a scenario sets it (memory_creep)
            "train_rss_bytes": float(plan.host.get("train_rss_bytes", TRAIN_RSS_BYTES))
            if plan is not None else TRAIN_RSS_BYTES,
        }


def _down_row(t: float, node: str, idx: int, xid: dict[int, int]) -> dict[str, Any]:
    nan = None
    return {
        "ts": t,
        "node": node,
        "gpu": idx,
        "util": nan,
        "sm_active": nan,
        "mem_used_bytes": nan,
        "mem_total_bytes": MEM_TOTAL_BYTES,
        "power_w": nan,
        "tensor_active": nan,
        "dram_active": nan,
        "sm_occupancy": None,
        "temperature_c": None,
        "sm_clock_hz": None,
        "energy_j": None,
        "up": False,
        "xid": xid,
        "clock_events": {},
        "pcie_tx_bps": None,
        "pcie_rx_bps": None,
        "nvlink_tx_bps": None,
        "nvlink_rx_bps": None,
    }
