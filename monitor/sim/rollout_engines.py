"""The rollout engines of a simulated run: what each vLLM / SGLang server reports, any instant.

verl's server-mode rollout runs one engine server per tensor-parallel group. With the agent loop
on a sync trainer (``agent_loop`` mode) the servers share the trainer's GPUs: they generate
during ``gen`` and sleep (KV cache freed) while the trainer trains. With the fully-async policy
(``fully_async`` mode) or the V1 separate-async trainer (``separate_async``) they form a
separate rollout pool that generates through the whole step and pauses its requests while the
weights are synced (``param_sync`` / ``update_weights``). The step's
:class:`~monitor.sim.scenarios.EnginePlan` bends the picture: a full KV cache that preempts, a
tail where a few requests run on one server, a saturated pool with requests queued, an idle
rollouter waiting for weights.

``RolloutSim(run).states_at(t)`` gives one dict per server (``ROLLOUT_STATE_KEYS``): gauges
(KV cache use 0..1, running / waiting / paused requests, sleeping 0/1) and counters that only
grow (preemptions, generation tokens, queue-time and end-to-end latency sums and counts), as
the engines' ``/metrics`` do. ``frame(interval)`` is the same as ``monitor.frames``'s rollout
frame. Deterministic: a sample depends only on ``t``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import pandas as pd

from monitor.sim.scenarios import EnginePlan

#: Keys of one server's state.
ROLLOUT_STATE_KEYS: tuple[str, ...] = (
    "server", "engine", "model", "kv_cache_usage", "running", "waiting", "paused",
    "preemptions_total", "generation_tokens_total", "queue_time_sum_s", "queue_time_count",
    "e2e_latency_sum_s", "e2e_latency_count", "sleeping",
)
#: The rollout frame's columns (``monitor.frames.ROLLOUT_COLUMNS``).
FRAME_COLUMNS: tuple[str, ...] = (
    "ts", "node", "server", "engine", "model", "kv_cache_usage", "running", "waiting", "paused",
    "preemptions_total", "generation_tokens_total", "queue_time_mean_s", "e2e_latency_mean_s",
    "sleeping",
)
DEFAULT_MODEL = "Qwen/Qwen2.5-7B-Instruct"
#: GPUs per engine server (``actor_rollout_ref.rollout.tensor_model_parallel_size``).
TENSOR_PARALLEL = 2
#: Servers of the fully-async rollout pool (``rollout.nnodes`` 1 x ``n_gpus_per_node`` 8, TP 2).
POOL_SERVERS = 4
_TAIL_RATE = 0.02  # share of a server's decode rate a lone tail request gets


@dataclass
class _Window:
    """One step as the engines see it."""

    start: float  # the engines start generating
    active_end: float  # they stop (gen ends, or the rollouter has all it needs)
    sync: tuple[float, float]  # the weight sync (fully async: requests paused meanwhile)
    end: float  # the step's end
    plan: EnginePlan
    finish: list[float]  # per server: share of the active window until it drains
    tokens: float  # generation tokens per server in this step
    requests: int  # requests completed per server in this step
    e2e_s: float  # mean end-to-end latency of a request


def _noise(t: float, i: int, channel: int) -> float:
    """Deterministic noise in [-1, 1) from the time (2 Hz) and the server."""
    x = math.sin(math.floor(t * 2.0) * 12.9898 + i * 78.233 + channel * 37.719) * 43758.5453
    return 2.0 * (x - math.floor(x)) - 1.0


class RolloutSim:
    """Per-server engine state of a :class:`~monitor.sim.engine.SimRun` at any instant.

    ``servers`` defaults to GPUs per node / TP for colocated engines (agent loop) and
    ``POOL_SERVERS`` for a fully-async rollout pool; ``engine`` is ``vllm`` or ``sglang``.
    A ``sync`` run has no engine servers (``servers`` 0, ``states_at`` empty).
    """

    def __init__(self, run: Any, engine: str = "vllm", model: str = DEFAULT_MODEL,
                 servers: int | None = None) -> None:
        if engine not in ("vllm", "sglang"):
            raise ValueError(f"unknown engine {engine!r}; valid: vllm, sglang")
        self.run = run
        self.engine = engine
        self.model = model
        self.mode = getattr(run, "mode", "sync")
        colocated = self.mode == "agent_loop"
        if servers is None:
            if self.mode == "sync":
                servers = 0
            elif colocated:
                servers = max(1, run.gpus_per_node // TENSOR_PARALLEL)
            else:
                servers = POOL_SERVERS
        self.servers = int(servers)
        self.colocated = colocated
        self.names = [f"{engine}-{i}" for i in range(self.servers)]
        self._windows: list[_Window] = []
        self._starts: list[float] = []
        self._base: list[list[list[float]]] = []  # per window, per server: counters at start
        self.rebuild()

    # ------------------------------------------------------------------ planning
    def rebuild(self) -> None:
        """(Re)compute the windows from the run's steps (after ``run.rebase``)."""
        self._windows = []
        if self.servers == 0:
            return
        prev_end = None
        plans = self.run.step_plans()
        for st in self.run.steps:
            iv = {lab: (a, b) for lab, a, b in st.timeline if lab != "gap"}
            step_plan = plans.get(st.step - 1)
            plan = step_plan.engine if step_plan is not None else EnginePlan()
            sync = iv.get("reshard", (st.end, st.end))
            if self.colocated:
                start, active_end = iv["gen"]
            else:
                start = st.start if prev_end is None else prev_end
                active_end = start + (sync[0] - start) * (1.0 - plan.idle_share)
            prev_end = st.end
            resp = float(st.metrics.get("response_length/mean", 500.0))
            per_server = max(1, 64 * self.run.n_gpus // self.servers)
            span = max(active_end - start, 1e-3)
            self._windows.append(_Window(
                start=start, active_end=active_end, sync=sync, end=st.end, plan=plan,
                finish=self._finish(step_plan),
                tokens=per_server * resp, requests=per_server,
                e2e_s=span * (0.55 if self.colocated else 0.45),
            ))
        self._starts = [w.start for w in self._windows]
        self._base = []
        acc = [[0.0] * 6 for _ in range(self.servers)]
        for w in self._windows:
            self._base.append([list(a) for a in acc])
            for i in range(self.servers):
                full = self._counters(w, i, w.end)
                acc[i] = [x + y for x, y in zip(acc[i], full, strict=True)]

    def _finish(self, seg_plan: Any) -> list[float]:
        """Per server: the share of the active window until its last request is done (the
        latest of its tensor-parallel GPUs in the step plan's ``gen_finish``)."""
        out = []
        for i in range(self.servers):
            if not self.colocated:
                out.append(1.0)
                continue
            gpus = range(i * TENSOR_PARALLEL, (i + 1) * TENSOR_PARALLEL)
            fin = [seg_plan.gen_finish[g] for g in gpus
                   if seg_plan is not None and g < len(seg_plan.gen_finish)]
            out.append(max(fin) if fin else 1.0)
        return out

    # ------------------------------------------------------------------ state
    def _running(self, w: _Window, i: int, f: float) -> float:
        """Requests running on server ``i`` at share ``f`` of the active window."""
        p = w.plan
        r0 = w.requests
        if p.tail_from is not None:
            if f < p.tail_from:
                return r0 * (1.0 - f / p.tail_from) ** 0.6 + (p.tail_running if i == 0 else 0)
            return float(p.tail_running) if i == 0 else 0.0
        if not self.colocated:
            return r0 * (1.0 if p.saturated else 0.8)
        fin = w.finish[i]
        return r0 * (1.0 - f / fin) ** 0.6 if f < fin else 0.0

    def _counters(self, w: _Window, i: int, t: float) -> list[float]:
        """Counter increments of server ``i`` from the window's start until ``t``:
        preemptions, tokens, queue-time sum, queue count, e2e sum, e2e count."""
        span = max(w.active_end - w.start, 1e-3)
        f = min(max((t - w.start) / span, 0.0), 1.0)
        p = w.plan
        share = f
        if p.tail_from is not None:  # tokens: most before the tail, a trickle after it
            head = min(f, p.tail_from) / p.tail_from
            tail = max(0.0, f - p.tail_from) / max(1e-9, 1.0 - p.tail_from)
            share = 0.97 * head + 0.03 * tail if i == 0 else head
        done = w.requests * share
        return [p.preempt_per_s * span * f, w.tokens * share, done * p.queue_time_s, done,
                done * w.e2e_s, done]

    def states_at(self, t: float) -> list[dict[str, Any]]:
        """One dict per server (``ROLLOUT_STATE_KEYS``) at simulated time ``t``."""
        if self.servers == 0:
            return []
        k = bisect_right(self._starts, t) - 1
        out = []
        for i, name in enumerate(self.names):
            row = {"server": name, "engine": self.engine, "model": self.model,
                   "kv_cache_usage": 0.0, "running": 0, "waiting": 0, "paused": 0,
                   "sleeping": 1 if self.colocated else 0}
            if k < 0:
                counters = [0.0] * 6
            else:
                w = self._windows[k]
                counters = [a + b for a, b in zip(self._base[k][i], self._counters(w, i, t),
                                                   strict=True)]
                if t < w.end or k == len(self._windows) - 1 and t < w.end + 1e-9:
                    self._gauges(row, w, i, t)
            for key, val in zip(("preemptions_total", "generation_tokens_total",
                                 "queue_time_sum_s", "queue_time_count", "e2e_latency_sum_s",
                                 "e2e_latency_count"), counters, strict=True):
                row[key] = float(math.floor(val)) if key in (
                    "preemptions_total", "generation_tokens_total", "queue_time_count",
                    "e2e_latency_count") else float(val)
            out.append(row)
        return out

    def _gauges(self, row: dict[str, Any], w: _Window, i: int, t: float) -> None:
        p = w.plan
        span = max(w.active_end - w.start, 1e-3)
        if w.start <= t < w.active_end:
            f = (t - w.start) / span
            running = self._running(w, i, f)
            row["sleeping"] = 0
            row["running"] = int(round(max(0.0, running * (1.0 + 0.04 * _noise(t, i, 1)))))
            left = 1.0 if not self.colocated else max(0.0, 1.0 - f)
            row["waiting"] = int(round(p.waiting_share * w.requests * left
                                       * (1.0 + 0.1 * _noise(t, i, 2))))
            load = min(1.0, running / max(w.requests, 1))
            kv = p.kv_level * load ** 0.5 if p.preempt_per_s == 0 else (
                p.kv_level if load > 0.25 else p.kv_level * load * 4)
            row["kv_cache_usage"] = float(min(1.0, max(0.0, kv * (1.0 + 0.012 * _noise(t, i, 3)))))
        elif w.sync[0] <= t < w.sync[1]:
            row["sleeping"] = 0  # awake to receive the new weights
            if not self.colocated and p.idle_share == 0:  # in-flight requests wait meanwhile
                row["paused"] = int(round(self._running(w, i, 1.0)))
                row["kv_cache_usage"] = float(p.kv_level * 0.9)
        elif not self.colocated:
            row["sleeping"] = 0  # the rollouter idles, waiting for new weights

    # ------------------------------------------------------------------ frames
    def frame(self, interval: float = 1.0, node: str | None = None) -> pd.DataFrame:
        """Every server's state every ``interval`` seconds over the run, as the rollout frame
        (``FRAME_COLUMNS``; queue time and e2e latency are the means of the requests done
        since the previous sample, NaN when none finished)."""
        node = node or (self.run.node_names[0] if self.run.node_names else "node0")
        rows = []
        prev: dict[str, tuple[float, ...]] = {}
        n = int(math.floor((self.run.end_time - self.run.start_time) / interval)) + 1
        for j in range(n if self.servers else 0):
            t = self.run.start_time + j * interval
            for s in self.states_at(t):
                sums = (s["queue_time_sum_s"], s["queue_time_count"], s["e2e_latency_sum_s"],
                        s["e2e_latency_count"])
                last = prev.get(s["server"], (0.0, 0.0, 0.0, 0.0))
                prev[s["server"]] = sums
                d = [a - b for a, b in zip(sums, last, strict=True)]
                rows.append({
                    "ts": round(t, 3), "node": node, "server": s["server"],
                    "engine": s["engine"], "model": s["model"],
                    "kv_cache_usage": round(s["kv_cache_usage"], 4),
                    "running": s["running"], "waiting": s["waiting"], "paused": s["paused"],
                    "preemptions_total": s["preemptions_total"],
                    "generation_tokens_total": s["generation_tokens_total"],
                    "queue_time_mean_s": _mean(d[0], d[1]),
                    "e2e_latency_mean_s": _mean(d[2], d[3]),
                    "sleeping": s["sleeping"],
                })
        return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))


def _mean(total: float, count: float) -> float:
    return round(total / count, 4) if count > 0 else math.nan
