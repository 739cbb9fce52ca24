"""The seam between the exporter and the monitor: every collector publishes through the Sink
protocol only, so another monitor (here a plain recording sink) receives everything the built-in
one does; the built-in Recorder keeps writing one part when the other refuses."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from exporters.collectors.gpu import GpuCollector
from exporters.collectors.host import HostCollector
from exporters.collectors.nccl import NcclCollector
from exporters.collectors.verl_log import VerlLogCollector
from exporters.gpu.sim import SimBackend
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext
from monitor.live.live_monitor import LiveMonitor, Recorder
from monitor.live.rolling_window import RollingWindow
from monitor.live.sink import NullSink, Sink


class ListSink(Sink):
    """A monitor of its own: keeps what it is given, by kind. Subclassing the protocol, it
    implements ``add_rows`` once and gets ``add_gpu`` and the other per-kind spellings."""

    def __init__(self) -> None:
        self.got: dict[str, list] = {k: [] for k in ("gpu", "host", "steps", "events", "nccl",
                                                   "rollout", "positions")}

    def add_rows(self, kind, rows):
        self.got[kind].extend(rows)

    def add_steps(self, steps):
        self.got["steps"].extend(steps)

    def add_events(self, events):
        self.got["events"].extend(events)

    def add_log_positions(self, positions):
        self.got["positions"].extend(positions)

    def saved_log_positions(self):
        return {}


def _nccl_record(ts: float) -> str:
    return json.dumps({
        "header": {"id": "0xabc", "comm_name": "DP Group 0", "rank": 1, "n_ranks": 2,
                   "nnodes": 1},
        "metadata": {"dump_timestamp_us": int(ts * 1e6), "hostname": "n0", "pid": 1},
        "coll_perf": {"coll": "AllReduce", "coll_sn": 1, "coll_msg_size_bytes": 1 << 20,
                      "coll_exec_time_us": 1000, "coll_algobw_gbs": 50.0,
                      "coll_busbw_gbs": 100.0},
    }) + "\n"


def test_every_collector_publishes_through_the_sink_alone(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text("(TaskRunner pid=11) step:1 - timing_s/gen:10.0 - timing_s/step:20.0 - "
                   "training/global_step:1\n"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                   "(TaskRunner pid=11) step:2 - timing_s/gen:10.0 - timing_s/step:20.0 - "
                   "training/global_step:2\n")
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    (nccl / "n0-pid1.log").write_text(_nccl_record(time.time()))
    sink = ListSink()
    assert isinstance(sink, Sink)
    ctx = ExporterContext(node="n0", interval=1.0, sink=sink, options=ExporterOptions(
        log=(str(log),), nccl_dir=str(nccl)))  # no window, no store: only the sink
    collectors = [GpuCollector(ctx, backend=SimBackend("healthy", gpus_per_node=2)),
                  HostCollector(ctx), VerlLogCollector(ctx), NcclCollector(ctx)]
    for _ in range(2):  # the host's CPU shares need two readings
        for col in collectors:
            assert col.sample_once(), col.last_error
        time.sleep(0.05)
    got = sink.got
    assert sorted({r["gpu"] for r in got["gpu"]}) == [0, 1]
    assert got["host"] and got["host"][0]["node"] == "n0"
    assert [s.step for s in got["steps"]] == [1, 2]
    assert [e.kind for e in got["events"]] == ["oom"]
    assert [(r["coll"], r["ops"]) for r in got["nccl"]] == [("AllReduce", 1)]


def test_the_recorder_writes_the_window_when_the_store_refuses_and_says_so():
    class FullDisk:
        def put_rows(self, kind, rows):
            raise OSError("No space left on device")

    window = RollingWindow()
    recorder = Recorder(window, FullDisk())
    assert isinstance(recorder, Sink) and isinstance(NullSink(), Sink)
    with pytest.raises(RuntimeError, match="GPU rows not written to the run store: No space"):
        recorder.add_gpu([{"ts": time.time(), "node": "n0", "gpu": 0, "util": 50.0}])
    assert len(window.frames()[1]) == 1  # the detectors still see the row


def test_the_monitor_is_the_sink_the_exporter_gives_its_collectors():
    monitor = LiveMonitor(ExporterOptions(window=60.0), node="n0", interval=1.0)
    assert isinstance(monitor, Sink)
    assert monitor.window.max_age_s == 60.0
    assert monitor.detect_interval == 30.0  # the default: detectors are costly
