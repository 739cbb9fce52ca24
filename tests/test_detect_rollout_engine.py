"""The engine detectors on simulated rollout frames: kv_cache_preemption and generation_tail."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from monitor.config import load_config
from monitor.detect import make_context, run_all
from monitor.detect.engine_detectors import (
    detect_generation_tail,
    detect_kv_cache_preemption,
    preemption_deltas,
)
from monitor.frames import rollout_frame

T0 = 1_800_000_000.0
NAN = float("nan")

#: (t seconds since T0, server index) -> dict of changed columns
Shape = Callable[[float, int], dict]


def frame(seconds: float, shape: Shape, servers: int = 1, every: float = 5.0,
          engine: str = "vllm", node: str = "n0"):
    """Scrapes of ``servers`` servers every ``every`` seconds; preemptions_total accumulates
    the ``preempted`` each shape call returns."""
    rows = []
    totals = [0.0] * servers
    for t in np.arange(0.0, seconds + 1e-9, every):
        for i in range(servers):
            got = {"kv_cache_usage": 0.4, "running": 16.0, "waiting": 0.0, "preempted": 0.0,
                   "sleeping": 0.0}
            got.update(shape(float(t), i))
            totals[i] += got.pop("preempted")
            rows.append({"ts": T0 + float(t), "node": node, "server": f"10.0.0.{i + 1}:8000",
                         "engine": engine, "model": "Qwen/Qwen2.5-7B-Instruct",
                         "preemptions_total": totals[i], "generation_tokens_total": t * 1000,
                         "paused": NAN, "queue_time_mean_s": 0.1, "e2e_latency_mean_s": 8.0,
                         **got})
    return rollout_frame(rows)


def ctx_for(df, now: float | None = None):
    end = float(df["ts"].max()) if now is None else now
    return make_context([], None, None, [], config=load_config(), now=end, rollout=df)


def preempting_from(onset: float, per_scrape: float = 2.0, stop: float | None = None,
                    kv: float = 0.99) -> Shape:
    def shape(t: float, _i: int) -> dict:
        if t >= onset and (stop is None or t < stop):
            return {"kv_cache_usage": kv, "preempted": per_scrape, "waiting": 12.0}
        return {}
    return shape


# --------------------------------------------------------------------- kv_cache_preemption


def test_a_full_kv_cache_that_keeps_preempting_opens_a_warning_within_two_minutes():
    onset = 60.0
    df = frame(400.0, preempting_from(onset))  # 2 per 5 s scrape: 24 preemptions/min
    flags = detect_kv_cache_preemption(ctx_for(df))
    assert [(f.kind, f.severity, f.end) for f in flags] == [("kv_cache_preemption", "warning",
                                                              None)]
    f = flags[0]
    assert f.start - (T0 + onset) <= 120.0
    assert f.scope["servers"] == ["10.0.0.1:8000"] and f.scope["node"] == "n0"
    assert "KV cache 99% full" in f.evidence and "24 preemptions/min" in f.evidence
    assert "12 requests waiting" in f.evidence
    assert any("actor_rollout_ref.rollout.gpu_memory_utilization" in a for a in f.advice)
    assert any("actor_rollout_ref.rollout.max_num_seqs" in a for a in f.advice)


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_live_runs_see_it_open_as_the_data_arrives():
    """The exporter runs the detectors on what it has so far: the flag opens once two bins
    have met the condition, well within two minutes, and keeps its start afterwards."""
    onset = 95.0
    df = frame(600.0, preempting_from(onset))
    opened_at = None
    starts = set()
    for now in np.arange(T0 + 30.0, T0 + 600.0, 30.0):
        flags = detect_kv_cache_preemption(ctx_for(df[df["ts"] <= now], now=float(now)))
        if flags and opened_at is None:
            opened_at = float(now)
        starts.update(f.start for f in flags)
    assert opened_at is not None and opened_at - (T0 + onset) <= 120.0
    assert len(starts) == 1


def test_heavy_preemption_is_critical_and_sglang_says_retractions():
    df = frame(300.0, preempting_from(0.0, per_scrape=10.0), engine="sglang")
    flags = detect_kv_cache_preemption(ctx_for(df))
    assert [f.severity for f in flags] == ["critical"]
    assert "120 retractions/min" in flags[0].evidence and "(sglang)" in flags[0].evidence


def test_a_full_cache_without_preemption_or_preemption_with_room_is_no_flag():
    full_quiet = frame(400.0, lambda t, i: {"kv_cache_usage": 0.99})
    assert detect_kv_cache_preemption(ctx_for(full_quiet)) == []
    with_room = frame(400.0, preempting_from(0.0, kv=0.5))
    assert detect_kv_cache_preemption(ctx_for(with_room)) == []


def test_a_short_burst_is_no_flag_and_a_cured_cache_closes_it():
    burst = frame(400.0, preempting_from(100.0, stop=115.0))
    assert detect_kv_cache_preemption(ctx_for(burst)) == []
    cured = frame(900.0, preempting_from(60.0, stop=400.0))
    flags = detect_kv_cache_preemption(ctx_for(cured))
    assert len(flags) == 1 and flags[0].end is not None
    assert T0 + 400.0 <= flags[0].end <= T0 + 430.0


def test_an_engine_restart_is_not_a_burst_of_preemptions():
    def restart(t: float, _i: int) -> dict:
        return {"kv_cache_usage": 0.99}
    df = frame(400.0, restart)
    df.loc[df["ts"] < T0 + 200.0, "preemptions_total"] = 5000.0  # before the restart
    df.loc[df["ts"] >= T0 + 200.0, "preemptions_total"] = 0.0  # counter starts again
    assert preemption_deltas(df).sum() == 0.0
    assert detect_kv_cache_preemption(ctx_for(df)) == []


def test_one_flag_per_node_names_every_server_that_preempts():
    def two_of_four(t: float, i: int) -> dict:
        return {"kv_cache_usage": 0.97, "preempted": 3.0} if i in (1, 3) else {}
    df = frame(400.0, two_of_four, servers=4)
    flags = detect_kv_cache_preemption(ctx_for(df))
    assert len(flags) == 1
    assert flags[0].scope["servers"] == ["10.0.0.2:8000", "10.0.0.4:8000"]


# --------------------------------------------------------------------- generation_tail


def rollouts(tail_s: float, period: float = 120.0, gen_s: float = 100.0, servers: int = 8
             ) -> Shape:
    """Each period: generation (all servers busy, then only server 0 with 2 requests for the
    last ``tail_s`` seconds of it), then training (engines asleep, nothing running)."""
    def shape(t: float, i: int) -> dict:
        phase = t % period
        if phase >= gen_s:
            return {"running": 0.0, "sleeping": 1.0, "kv_cache_usage": 0.0}
        if phase >= gen_s - tail_s:
            return {"running": 2.0 if i == 0 else 0.0, "kv_cache_usage": 0.05 if i == 0 else 0.0}
        return {"running": 32.0}
    return shape


def test_few_requests_running_while_the_pool_idles_is_a_generation_tail():
    df = frame(900.0, rollouts(tail_s=60.0), servers=8)
    flags = detect_generation_tail(ctx_for(df))
    assert [(f.kind, f.end) for f in flags] == [("generation_tail", None)]
    f = flags[0]
    assert f.severity == "warning"
    assert "only 2 requests were still running" in f.evidence
    assert "7 of 8 servers idled" in f.evidence and "peak 256" in f.evidence
    assert len(f.scope["servers"]) == 8
    assert any("actor_rollout_ref.rollout.over_sample_rate" in a for a in f.advice)


def test_a_short_tail_and_a_queue_are_no_generation_tail():
    short = frame(900.0, rollouts(tail_s=10.0), servers=8)
    assert detect_generation_tail(ctx_for(short)) == []

    def queued(t: float, i: int) -> dict:  # few running because the rest wait in the queue
        got = rollouts(tail_s=60.0)(t, i)
        return {**got, "waiting": 50.0} if got.get("running") == 2.0 else got
    assert detect_generation_tail(ctx_for(frame(900.0, queued, servers=8))) == []


def test_a_tail_that_is_most_of_the_rollout_is_critical():
    df = frame(900.0, rollouts(tail_s=80.0), servers=8)
    flags = detect_generation_tail(ctx_for(df))
    assert [f.severity for f in flags] == ["critical"]


def test_run_all_reads_the_rollout_frame_and_nothing_without_one():
    df = frame(400.0, preempting_from(0.0))
    kinds = {f.kind for f in run_all([], None, None, [], now=float(df["ts"].max()), rollout=df)}
    assert "kv_cache_preemption" in kinds
    assert detect_kv_cache_preemption(ctx_for(frame(0.0, lambda t, i: {}).iloc[:0],
                                              now=T0)) == []
