"""Dump a run store to the interchange files that ``verl-monitor analyze`` reads back.

``export_dir(store_path, out_dir)`` writes:

- ``gpu.csv``, ``host.csv``: samples in the interchange format (``monitor.frames``);
- ``train.jsonl``: one ``{"step": N, "ts": end_time, "data": {...raw metrics...}}`` per step,
  in end-time order, NaN/inf as null like verl's file logger (see ``jsonl_data``);
- ``events.json``, ``flags.json``: lists of the records' plain dicts;
- ``nccl.csv`` and ``meta.json`` besides, so nothing stored is left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from monitor.analysis.summary import json_safe
from monitor.frames import write_frame
from monitor.logs.keys import phases_and_total
from monitor.records import StepRecord
from monitor.store.runstore import RunStore


def export_dir(store_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Write the store's contents under ``out_dir`` (created if needed); returns row counts.

    Raises ``StoreError`` when the store file is missing or not a run store.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with RunStore(store_path, create=False) as store:
        gpu = store.gpu_frame()
        host = store.host_frame()
        nccl = store.nccl_frame()
        steps = store.steps()
        events = store.events()
        flags = store.flags()
        meta = store.meta()
    write_frame(gpu, out / "gpu.csv")
    write_frame(host, out / "host.csv")
    nccl.to_csv(out / "nccl.csv", index=False)
    with open(out / "train.jsonl", "w", encoding="utf-8") as fh:
        for s in steps:
            record = {"step": s.step, "ts": s.end_time, "data": jsonl_data(s)}
            fh.write(json.dumps(record, allow_nan=False) + "\n")
    _write_json(out / "events.json", [e.to_dict() for e in events])
    _write_json(out / "flags.json", [f.to_dict() for f in flags])
    _write_json(out / "meta.json", meta)
    return {
        "gpu": len(gpu),
        "host": len(host),
        "nccl": len(nccl),
        "steps": len(steps),
        "events": len(events),
        "flags": len(flags),
    }


def jsonl_data(step: StepRecord) -> dict[str, Any]:
    """The ``data`` object of a step's train.jsonl line: its raw metrics, NaN as null.

    Some phases come from log lines rather than metric keys (the breakdown format, HybridEngine
    and ParameterSynchronizer lines). So that reading the file back gives the same phases,
    the missing timers are added: ``timing_s/<phase>``, the weight sync as
    ``timing_s/update_weights``, the total as ``timing_s/step``; a timer the log line
    changed (``gen`` with a HybridEngine switch taken out) is set to the step's value.
    """
    data = json_safe(dict(step.metrics))
    derived, total = phases_and_total(data)
    if _same(derived, step.phases) and total == step.total:
        return data
    if step.total is not None and total is None:
        data["timing_s/step"] = json_safe(step.total)
    for phase, seconds in step.phases.items():
        if phase == "other" or seconds is None:
            continue
        key = "timing_s/update_weights" if phase == "reshard" else f"timing_s/{phase}"
        if phase not in derived or not _close(derived[phase], seconds):
            data[key] = json_safe(seconds)
    return data


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)


def _write_json(path: Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(json_safe(value), fh, indent=1, allow_nan=False)
        fh.write("\n")
