"""Compute processes joining and leaving a GPU become events; the first reading is the baseline."""

from __future__ import annotations

import os

from exporters.gpu.backend import GpuProcess, GpuReading
from exporters.gpu.processes import ProcessWatch, process_name


def _r(gpu: int, ts: float, *pids: int, up: bool = True, read: bool = True) -> GpuReading:
    procs = tuple(GpuProcess(p, 3 << 30) for p in pids) if read else None
    return GpuReading(index=gpu, ts=ts, up=up, processes=procs)


def test_first_reading_is_the_baseline_and_changes_after_it_are_events():
    w = ProcessWatch("n0", name_of=lambda pid: {99: "python3"}.get(pid, ""))
    assert w.update([_r(0, 1.0, 10, 11), _r(1, 1.0, 12)]) == []
    assert w.counts() == {0: 2, 1: 1}
    ev = w.update([_r(0, 2.0, 10, 11, 99), _r(1, 2.0, 12)])
    assert [(e.kind, e.time, e.data["gpu"], e.data["pid"]) for e in ev] == [
        ("gpu_process_started", 2.0, 0, 99)]
    assert ev[0].message == "process 99 (python3) started on GPU 0, 3.0 GiB"
    assert ev[0].data["node"] == "n0" and ev[0].data["used_bytes"] == 3 << 30
    ev = w.update([_r(0, 3.0, 10, 11), _r(1, 3.0)])
    assert [(e.kind, e.data["gpu"], e.data["pid"]) for e in ev] == [
        ("gpu_process_exited", 0, 99), ("gpu_process_exited", 1, 12)]
    assert ev[0].message == "process 99 (python3) left GPU 0"


def test_gpus_down_or_without_a_process_list_are_left_alone():
    w = ProcessWatch("n0", name_of=lambda pid: "")
    w.update([_r(0, 1.0, 10)])
    assert w.update([_r(0, 2.0, up=False), _r(1, 2.0, 5, read=False)]) == []
    assert w.counts() == {0: 1}
    assert w.update([_r(0, 3.0, 10)]) == []  # back with the same process: nothing changed


def test_process_name_of_this_process_and_of_none():
    assert process_name(os.getpid())
    assert process_name(2**22 + 12345) == ""
