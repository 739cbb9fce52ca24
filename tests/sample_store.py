"""Build a run store from a simulated verl run, without waiting for it to play in real time.

Test scaffolding (kept out of the shipped package), used by the dashboard and store tests and
``bench/dashboard.py``: the simulator plans the run and its telemetry, the log parser reads the
log it wrote (as the exporter would), the detectors turn it into flags, and everything lands in
a real :class:`~monitor.store.runstore.RunStore`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pandas as pd


def build_store(
    path: str | Path,
    scenario: str = "demo",
    steps: int | None = None,
    nodes: int = 1,
    gpus_per_node: int = 8,
    seed: int = 0,
    end_time: float | None = None,
    step_seconds: float | None = None,
    detect: bool = True,
    nccl: bool = True,
) -> dict:
    """Simulate ``scenario`` ending at ``end_time`` (default now) into the store at ``path``.

    Returns counts: ``{"gpu_samples", "steps", "flags", "start", "end"}``. With ``nccl`` a
    plausible NCCL Inspector series (AllReduce and AllGather every 5 s) is added, scaled by
    each step's update phase, since the simulator does not write NCCL dumps.
    """
    from monitor.logs.canonical_records import parse_file
    from monitor.sim.engine import SimRun
    from monitor.store.runstore import RunStore

    probe = SimRun(scenario, steps=steps, nodes=nodes, gpus_per_node=gpus_per_node, seed=seed,
                   step_seconds=step_seconds, start_time=0.0, timestamps=True)
    duration = float(probe.log_end_time)
    end = time.time() if end_time is None else float(end_time)
    run = SimRun(scenario, steps=steps, nodes=nodes, gpus_per_node=gpus_per_node, seed=seed,
                 step_seconds=step_seconds, start_time=end - duration, timestamps=True)
    with tempfile.TemporaryDirectory(prefix="verlmon-sim-") as tmp:
        log = Path(tmp) / "train.log"
        with log.open("w", encoding="utf-8") as fh:
            for _, line in run.timed_lines():
                fh.write(line + "\n")
        parsed = parse_file(log, log_end=run.log_end_time)
    gpu = run.gpu_frame(1.0)
    host = run.host_frame(1.0)
    flags = []
    if detect:
        from monitor.detect import run_all

        flags = run_all(parsed.steps, gpu, host, parsed.events, now=run.log_end_time,
                        actors=parsed.actors)
    store = RunStore(path)
    try:
        store.add_gpu_samples(gpu.to_dict("records"))
        store.add_host_samples(host.to_dict("records"))
        store.add_steps(parsed.steps)
        store.add_events(parsed.events)
        store.upsert_flags(flags)
        if nccl:
            store.add_nccl_samples(_nccl_rows(parsed.steps, run.node_names))
        if run.mode != "sync":  # the rollout engines, sampled as the exporter's collector does
            store.add_rollout_samples(run.rollout_frame(5.0).to_dict("records"))
        store.set_meta("nodes", list(run.node_names))
        store.set_meta("scenario", scenario)
    finally:
        store.close()
    return {"gpu_samples": len(gpu), "steps": len(parsed.steps), "flags": len(flags),
            "start": float(gpu["ts"].min()), "end": float(gpu["ts"].max())}


def _nccl_rows(steps: list, nodes: list[str]) -> list[dict]:
    """NCCL samples every 5 s: collective time follows each step's update_actor share."""
    if not steps:
        return []
    df = pd.DataFrame([{"end": s.end_time, "total": s.total or 0.0,
                        "update": s.phases.get("update_actor", 0.0)} for s in steps
                       if s.end_time is not None])
    rows = []
    for _, st in df.iterrows():
        start = st["end"] - st["total"]
        share = st["update"] / st["total"] if st["total"] else 0.0
        t = start
        while t < st["end"]:
            for node in nodes:
                for coll, frac, bw in (("AllReduce", 0.6, 180e9), ("AllGather", 0.4, 150e9)):
                    exec_s = 5.0 * share * frac * 0.5
                    rows.append({"ts": t, "node": node, "coll": coll, "comm": "actor",
                                 "ops": 40.0, "bytes": exec_s * bw, "exec_s": exec_s,
                                 "busbw_bps": bw})
            t += 5.0
    return rows
