"""One table of the sampled telemetry kinds: name, columns, store table, how frames are built.

Every part that carries sample rows reads this table instead of a method per kind: the
collectors publish ``add_rows(kind, rows)`` through the Sink (monitor/live/sink.py); the live
monitor's Recorder hands them to the rolling window (monitor/live/rolling_window.py) and the
store writer (monitor/store/writer.py), which writes them to the kind's table
(monitor/store/runstore.py: ``add_samples``, ``samples_frame``); retention folds them
(monitor/store/retention.py); monitor/frames.py builds, reads and empties the canonical frame
of a kind (``rows_frame``, ``read_frame``, ``empty_frame``).

Adding a kind is one entry in :data:`KIND` (with ``create_on_use``, its store table is made at
its first row). The parts look a kind up in :data:`KIND` when they use it, so an entry added at
run time (a test's ``monkeypatch.setitem(KIND, ...)``) reaches all of them. The per-kind names
(``add_gpu``, ``put_gpu``, ``gpu_frame``, ``read_gpu_frame``, ...) stay, as one-line spellings
of the generic ones.

This module holds data only (no pandas): monitor/frames.py imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

#: GPU samples. ``sm_active``, ``tensor_active``, ``dram_active``, ``power_w`` and the PCIe /
#: NVLink rates may be empty (NaN).
GPU_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "gpu",
    "util",
    "sm_active",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "tensor_active",
    "dram_active",
    # GPM link traffic, bytes per second (issue 23: the signature of offload copies and
    # collectives); optional: stores and CSVs written before them load with NaN here
    "pcie_tx_bps",
    "pcie_rx_bps",
    "nvlink_tx_bps",
    "nvlink_rx_bps",
)
GPU_REQUIRED: tuple[str, ...] = ("ts", "node", "gpu", "util", "mem_used_bytes", "mem_total_bytes")

#: Host samples. ``iowait_pct`` and ``disk_read_bps`` may be empty.
HOST_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "cpu_max_core_pct",
    "cpu_avg_pct",
    "iowait_pct",
    "disk_read_bps",
    # resident memory of the verl training process tree (the job's workers), bytes (issue 23:
    # host memory creep); optional: stores and CSVs written before it load with NaN here
    "train_rss_bytes",
)
HOST_REQUIRED: tuple[str, ...] = ("ts", "node", "cpu_max_core_pct", "cpu_avg_pct")

#: NCCL Inspector records as the store keeps them: per node, collective and communicator, the
#: operations, bytes and execution seconds (summed over the node's ranks) of one dump interval.
NCCL_COLUMNS: tuple[str, ...] = ("ts", "node", "coll", "comm", "ops", "bytes", "exec_s",
                                 "busbw_bps")
NCCL_REQUIRED: tuple[str, ...] = ("ts", "node", "coll", "exec_s")

#: Rollout-engine samples (vLLM / SGLang servers behind verl's agent loop), one row per server
#: and scrape: KV-cache use 0..1, requests running / waiting / paused, cumulative preemptions
#: (SGLang: retractions) and generated tokens, mean queue time and end-to-end latency since the
#: previous scrape, and ``sleeping`` (1 while the engine is asleep, NaN where it does not say).
ROLLOUT_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "server",
    "engine",
    "model",
    "kv_cache_usage",
    "running",
    "waiting",
    "paused",
    "preemptions_total",
    "generation_tokens_total",
    "queue_time_mean_s",
    "e2e_latency_mean_s",
    "sleeping",
)
ROLLOUT_REQUIRED: tuple[str, ...] = ("ts", "server")


@dataclass(frozen=True)
class TelemetryKind:
    """One kind of sample rows.

    ``what`` names its rows in an error ("GPU rows"); ``columns`` are the canonical columns
    (``ts`` and ``node`` first); ``required`` the ones a telemetry file must have
    (``read_frame``); ``text`` the columns kept as text (every other one is a number; ``gpu``
    a nullable integer); ``table`` its run-store table; ``series`` the columns that name one
    series (retention folds each series into buckets); ``aggregates`` how retention folds a
    value column (default ``avg``); ``keeps_extras`` keeps the extra keys of the live rows
    (the GPU collector's ``up``, ``xid_total``, ``throttle``) as extra columns of the
    window's frame; ``create_on_use`` marks a table added after the first stores (created at
    its first row, so an older store keeps its schema and reads as holding none)."""

    name: str
    what: str
    columns: tuple[str, ...]
    required: tuple[str, ...]
    table: str
    series: tuple[str, ...]
    text: tuple[str, ...] = ("node",)
    aggregates: Mapping[str, str] = field(default_factory=dict)
    keeps_extras: bool = False
    create_on_use: bool = False


#: Every sampled kind by name, in the order they are written. Parts read it when they use a
#: kind (never a copy made at import), so an entry added here reaches all of them.
KIND: dict[str, TelemetryKind] = {k.name: k for k in (
    TelemetryKind("gpu", "GPU rows", GPU_COLUMNS, GPU_REQUIRED, "gpu_samples",
                  series=("node", "gpu"), keeps_extras=True,
                  aggregates={"mem_used_bytes": "max", "mem_total_bytes": "max"}),
    TelemetryKind("host", "host rows", HOST_COLUMNS, HOST_REQUIRED, "host_samples",
                  series=("node",), keeps_extras=True),
    TelemetryKind("nccl", "NCCL rows", NCCL_COLUMNS, NCCL_REQUIRED, "nccl_samples",
                  series=("node", "coll", "comm"), text=("node", "coll", "comm"),
                  aggregates={"ops": "sum", "bytes": "sum", "exec_s": "sum"}),
    # rollout engines: retention keeps the fullest cache and the counters' last value
    TelemetryKind("rollout", "rollout-engine rows", ROLLOUT_COLUMNS, ROLLOUT_REQUIRED,
                  "rollout_samples", series=("node", "server", "engine", "model"),
                  text=("node", "server", "engine", "model"), create_on_use=True,
                  aggregates={"kv_cache_usage": "max", "preemptions_total": "max",
                              "generation_tokens_total": "max", "sleeping": "max"}),
)}


def kinds() -> tuple[TelemetryKind, ...]:
    """The kinds of :data:`KIND` now, in the order they are written."""
    return tuple(KIND.values())


#: The kinds of the first stores, in the order they are written (read :func:`kinds` in code
#: that should see an entry added later).
KINDS: tuple[TelemetryKind, ...] = kinds()


class KindRows(Protocol):
    """Takes sample rows by kind: ``add_rows(kind, rows)``, and the per-kind spellings
    ``add_gpu(rows)`` == ``add_rows("gpu", rows)`` (and host, NCCL, rollout), defined here once.

    The Sink (monitor/live/sink.py), the rolling window and the store writer subclass it and
    implement ``add_rows`` only."""

    def add_rows(self, kind: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Rows of ``kind`` (a key of :data:`KIND`): dicts keyed by its columns."""

    def add_gpu(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """One sample of every GPU (rows as in ``exporters.collectors.gpu.reading_to_row``)."""
        self.add_rows("gpu", rows)

    def add_host(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Host rows: CPU busiest core and mean, iowait, disk reads, training RSS."""
        self.add_rows("host", rows)

    def add_nccl(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Growth of the NCCL Inspector totals per (collective, communicator) since last time."""
        self.add_rows("nccl", rows)

    def add_rollout(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """One scrape of each rollout engine (``ROLLOUT_COLUMNS``)."""
        self.add_rows("rollout", rows)
