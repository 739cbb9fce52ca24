"""Compute processes coming and going on each GPU, as events for the detectors.

A process that starts on a GPU in the middle of a run (a notebook, a second job, a stray
benchmark) competes with the training job for that GPU: every phase there slows down. NVML's
running-process list shows it. The first reading of each GPU is the baseline; after it, a PID
that appears is a ``gpu_process_started`` event and one that disappears ``gpu_process_exited``,
with the GPU, the PID, its name where this node can see it, and the memory it holds.
``monitor.detect.contention`` judges them against the step times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from exporters.gpu.backend import GpuProcess, GpuReading
from monitor.records import Event


def process_name(pid: int) -> str:
    """The process's name, or "" when this node cannot see it (another PID namespace)."""
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:  # noqa: BLE001 - gone, hidden or denied: the PID alone still says it
        return ""


class ProcessWatch:
    """Per GPU, the compute processes last seen; ``update`` returns what changed as events."""

    def __init__(self, node: str, name_of: Callable[[int], str] = process_name) -> None:
        self.node = node
        self._name_of = name_of
        self._seen: dict[int, dict[int, GpuProcess]] = {}
        self._names: dict[int, str] = {}

    def counts(self) -> dict[int, int]:
        """Compute processes per GPU index, for the GPUs whose list was read."""
        return {gpu: len(procs) for gpu, procs in self._seen.items()}

    def update(self, readings: Iterable[GpuReading]) -> list[Event]:
        """Take one round of readings; GPUs without a process list (``None``) are skipped."""
        events: list[Event] = []
        for r in readings:
            if not r.up or r.processes is None:
                continue
            cur = {p.pid: p for p in r.processes}
            prev = self._seen.get(r.index)
            self._seen[r.index] = cur
            if prev is None:
                continue  # the baseline: what already runs is not news
            for pid in sorted(cur.keys() - prev.keys()):
                name = self._names.setdefault(pid, self._name_of(pid))
                used = cur[pid].used_bytes
                held = f", {used / 2**30:.1f} GiB" if used else ""
                events.append(Event(
                    "gpu_process_started", r.ts,
                    message=f"process {pid}{' (' + name + ')' if name else ''} started on GPU "
                            f"{r.index}{held}",
                    data={"node": self.node, "gpu": r.index, "pid": pid, "name": name,
                          "used_bytes": used}))
            for pid in sorted(prev.keys() - cur.keys()):
                name = self._names.pop(pid, "")
                events.append(Event(
                    "gpu_process_exited", r.ts,
                    message=f"process {pid}{' (' + name + ')' if name else ''} left GPU "
                            f"{r.index}",
                    data={"node": self.node, "gpu": r.index, "pid": pid, "name": name}))
        return events
