"""Dump a run store to the interchange files that ``verl-monitor analyze`` reads back.

``export_dir(store_path, out_dir)`` writes:

- ``gpu.csv``, ``host.csv``: samples in the interchange format (``monitor.frames``);
- ``train.jsonl``: one ``{"step": N, "ts": end_time, "data": {...raw metrics...}}`` per step,
  in end-time order, NaN/inf as null like verl's file logger (see ``jsonl_data``);
- ``events.json``, ``flags.json``: lists of the records' plain dicts;
- ``nccl.csv``, ``rollout.csv`` (rollout-engine samples, when the store has them) and
  ``meta.json`` besides, so nothing stored is left behind.

Samples and steps are streamed: read a chunk at a time in the order the files list them and
appended to the files, so memory stays bounded whatever the store's size (142 MiB peak RSS
for a 2 GiB store; ``bench/store.py --export``). The files are byte for byte what
writing each table read whole would give.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from monitor.analysis.summary import json_safe
from monitor.frames import GPU_COLUMNS, HOST_COLUMNS, ROLLOUT_COLUMNS, cast_columns
from monitor.logs.keys import phases_and_total
from monitor.records import StepRecord
from monitor.store.runstore import ROLLOUT_TABLE, RunStore, _has_table
from monitor.store.schema import NCCL_COLUMNS

#: Sample rows read and written at a time (a few MB of Python objects).
CHUNK_ROWS = 20_000
#: Steps read at a time: a step row carries every metric of the step (kilobytes of JSON).
STEP_CHUNK_ROWS = 500
_STEP_COLUMNS = ("step, end_time, total, phases, throughput, mem_allocated_peak_bytes, "
                 "mem_reserved_peak_bytes, metrics, time_source, source")


def export_dir(
    store_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    chunk_rows: int = CHUNK_ROWS,
    step_chunk_rows: int = STEP_CHUNK_ROWS,
) -> dict[str, int]:
    """Write the store's contents under ``out_dir`` (created if needed); returns row counts.

    Reads ``chunk_rows`` samples and ``step_chunk_rows`` steps at a time. Raises
    ``StoreError`` when the store file is missing or not a run store.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with RunStore(store_path, create=False) as store:
        for kind, table, columns in (("gpu", "gpu_samples", GPU_COLUMNS),
                                     ("host", "host_samples", HOST_COLUMNS),
                                     ("nccl", "nccl_samples", NCCL_COLUMNS)):
            with open(out / f"{kind}.csv", "w", encoding="utf-8", newline="") as fh:
                counts[kind] = write_samples_csv(store, table, columns, fh, chunk_rows)
        if _has_table(store._conn(), ROLLOUT_TABLE):  # rollout engines (--rollout-server)
            with open(out / "rollout.csv", "w", encoding="utf-8", newline="") as fh:
                counts["rollout"] = write_samples_csv(store, ROLLOUT_TABLE, ROLLOUT_COLUMNS, fh,
                                                      chunk_rows)
        with open(out / "train.jsonl", "w", encoding="utf-8") as fh:
            counts["steps"] = 0
            for s in iter_steps(store, step_chunk_rows):
                record = {"step": s.step, "ts": s.end_time, "data": jsonl_data(s)}
                fh.write(json.dumps(record, allow_nan=False) + "\n")
                counts["steps"] += 1
        events = store.events()
        flags = store.flags()
        meta = store.meta()
    _write_json(out / "events.json", [e.to_dict() for e in events])
    _write_json(out / "flags.json", [f.to_dict() for f in flags])
    _write_json(out / "meta.json", meta)
    counts.update(events=len(events), flags=len(flags))
    return counts


def write_samples_csv(store: RunStore, table: str, columns: tuple[str, ...], fh: TextIO,
                      chunk_rows: int = CHUNK_ROWS) -> int:
    """Write a sample table as CSV (header, then rows in time order, ties in insertion
    order: the order of the store's whole-table frames), ``chunk_rows`` at a time; returns
    the rows written."""
    cursor = store._conn().execute(  # package-internal: the store's own connection
        f"SELECT {', '.join(columns)} FROM {table} ORDER BY ts, rowid")
    written = 0
    while True:
        rows = cursor.fetchmany(max(1, int(chunk_rows)))
        df = cast_columns(pd.DataFrame.from_records(rows, columns=list(columns)), columns)
        if rows or written == 0:
            df.to_csv(fh, index=False, header=written == 0)
        written += len(rows)
        if not rows:
            return written


def iter_steps(store: RunStore, chunk_rows: int = STEP_CHUNK_ROWS) -> Iterator[StepRecord]:
    """The store's steps as ``RunStore.steps()`` lists them (end-time order, steps without
    one last), read ``chunk_rows`` at a time."""
    cursor = store._conn().execute(
        f"SELECT {_STEP_COLUMNS} FROM steps ORDER BY end_time IS NULL, end_time, step")
    while rows := cursor.fetchmany(max(1, int(chunk_rows))):
        for row in rows:
            yield StepRecord(step=row[0], end_time=row[1], total=row[2],
                             phases=json.loads(row[3]), throughput=row[4],
                             mem_allocated_peak_bytes=row[5], mem_reserved_peak_bytes=row[6],
                             metrics=json.loads(row[7]), time_source=row[8] or "arrival",
                             source=row[9] or "console")


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
