"""Host collector (psutil): CPU per core and on average, iowait, disk, network, memory, and the
training process tree's CPU and resident memory.

CPU ratios come from ``cpu_times`` deltas between two samples, so they describe the last
interval (absent until the second sample). The training process is ``--train-pid`` when given,
else the first process whose command line names verl's trainer (``main_ppo``, ``verl.trainer``,
Ray's ``TaskRunner``); when none is found those two series are absent, not zero.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.registry import ExporterContext, register
from exporters.sampling import SampledCollector
from monitor import metric_names as m
from monitor.live import FlagGroup

#: Substrings of a command line that mark verl's trainer process.
TRAINER_MARKERS: tuple[str, ...] = ("main_ppo", "verl.trainer", "TaskRunner", "main_task")
#: Our own tools: never taken for the trainer even when their arguments name a verl log.
_OWN_MARKERS: tuple[str, ...] = ("verl-monitor", "verl_monitor", "monitor.cli")
#: Seconds between searches for the trainer while none is found.
RESCAN_S = 10.0
#: Seconds after which processes found not to be the trainer are looked at again.
FORGET_S = 300.0


@dataclass
class HostSnapshot:
    """Latest host reading; None where unknown."""

    ts: float
    cpu_max_core: float | None = None
    cpu_avg: float | None = None
    iowait: float | None = None
    disk_read_bytes: float | None = None
    disk_written_bytes: float | None = None
    disk_read_bps: float | None = None
    net_rx_bytes: float | None = None
    net_tx_bytes: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    train_cpu: float | None = None
    train_rss: float | None = None
    train_pid: int | None = None
    extra: dict = field(default_factory=dict)


def trainer_candidates(
    exclude: Iterable[int] = (), checked: set[int] | None = None
) -> Iterator[psutil.Process]:
    """Processes whose command line names verl's trainer (TRAINER_MARKERS), skipping
    ``exclude`` and the monitor's own processes.

    With ``checked``, processes that did not match are added to it and not read again on the
    next call (a command line rarely changes; reading every one costs ~0.2 ms a process).
    """
    skip = set(exclude)
    for pid in psutil.pids():
        if pid in skip or (checked is not None and pid in checked):
            continue
        try:
            proc = psutil.Process(pid)
            cmd = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            continue
        if any(marker in cmd for marker in TRAINER_MARKERS) and \
                not any(own in cmd for own in _OWN_MARKERS):
            yield proc
        elif checked is not None:
            checked.add(pid)


def find_trainer(
    exclude: Iterable[int] = (), checked: set[int] | None = None
) -> psutil.Process | None:
    """The verl trainer process on this host (the oldest candidate), or None."""
    found = list(trainer_candidates(exclude, checked))
    if not found:
        return None

    def started(p: psutil.Process) -> float:
        try:
            return p.create_time()
        except psutil.Error:
            return float("inf")

    return min(found, key=started)


def _cpu_busy(prev, cur) -> tuple[float, float] | None:
    """(busy, iowait) ratios of one core (or the whole machine) between two cpu_times."""
    total = sum(cur) - sum(prev)
    if total <= 0:
        return None
    idle = (cur.idle - prev.idle) + (getattr(cur, "iowait", 0.0) - getattr(prev, "iowait", 0.0))
    iowait = getattr(cur, "iowait", 0.0) - getattr(prev, "iowait", 0.0)
    busy = min(1.0, max(0.0, 1.0 - idle / total))
    return busy, min(1.0, max(0.0, iowait / total))


def add_flags(group: FlagGroup) -> None:
    """The host collector's flag: which process is the trainer."""
    group.add_argument("--train-pid", type=int, metavar="PID",
                       help="the verl trainer's process id (default: found by its command line)")


@register("host", default=True, flags=add_flags,
          help="host CPU (busiest core, mean, iowait), disk and network bytes, memory, and the "
          "training process tree's CPU and RSS (psutil)")
class HostCollector(SampledCollector):
    """Samples psutil every interval; exports the latest snapshot."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        self.snapshot: HostSnapshot | None = None
        self._prev_cores = None
        self._prev_total = None
        self._prev_disk_read: tuple[float, float] | None = None
        self._pinned_pid: int | None = ctx.options.train_pid
        self._trainer: psutil.Process | None = None
        self._next_scan = 0.0
        self._proc_cpu: dict[int, float] = {}
        self._proc_cpu_ts: float | None = None
        self._own = {os.getpid()}
        self._checked: set[int] = set()  # pids whose command line did not match
        self._forget_at = 0.0

    # --- sampling

    def sample(self) -> None:
        """Read psutil once; publish a host row to the sink."""
        now = time.time()
        snap = HostSnapshot(ts=now)
        cores = psutil.cpu_times(percpu=True)
        # the machine total is the sum of the same per-core reading (not a second call, which
        # would see other clock ticks), so the busiest core is never below the average
        total = type(cores[0])._make(map(sum, zip(*cores, strict=True))) if cores else None
        if self._prev_cores is not None and len(self._prev_cores) == len(cores):
            per_core = [_cpu_busy(p, c) for p, c in zip(self._prev_cores, cores, strict=True)]
            busy = [b[0] for b in per_core if b is not None]
            if busy:
                snap.cpu_max_core = max(busy)
            whole = _cpu_busy(self._prev_total, total)
            if whole is not None:
                snap.cpu_avg, snap.iowait = whole
                if not hasattr(total, "iowait"):
                    snap.iowait = None
        self._prev_cores, self._prev_total = cores, total

        disk = psutil.disk_io_counters()
        if disk is not None:
            snap.disk_read_bytes = float(disk.read_bytes)
            snap.disk_written_bytes = float(disk.write_bytes)
            if self._prev_disk_read is not None and now > self._prev_disk_read[0]:
                delta = max(0.0, disk.read_bytes - self._prev_disk_read[1])
                snap.disk_read_bps = delta / (now - self._prev_disk_read[0])
            self._prev_disk_read = (now, float(disk.read_bytes))

        nics = psutil.net_io_counters(pernic=True)
        if nics:
            real = [v for k, v in nics.items() if k != "lo" and not k.startswith("lo")]
            snap.net_rx_bytes = float(sum(v.bytes_recv for v in real))
            snap.net_tx_bytes = float(sum(v.bytes_sent for v in real))

        mem = psutil.virtual_memory()
        snap.mem_total = float(mem.total)
        snap.mem_used = float(mem.total - mem.available)

        self._sample_trainer(snap, now)
        self._apply_simulated_host(snap)
        self.snapshot = snap
        if snap.cpu_avg is not None:
            row = {
                "ts": self.ctx.clock(),  # the wall clock, or a sped-up simulated run's own
                "node": self.ctx.node,
                "cpu_max_core_pct": snap.cpu_max_core * 100.0,
                "cpu_avg_pct": snap.cpu_avg * 100.0,
                "iowait_pct": snap.iowait * 100.0 if snap.iowait is not None else None,
                "disk_read_bps": snap.disk_read_bps,
                "train_rss_bytes": snap.train_rss,  # memory_creep on the host (issue 23)
            }
            self.ctx.sink.add_host([row])

    def _apply_simulated_host(self, snap: HostSnapshot) -> None:
        """With the simulated GPU backend, report the scenario's host CPU, iowait and disk
        reads instead of this machine's, so GPU and host signatures belong to the same run."""
        backend = self.ctx.gpu_backend
        host_sample = getattr(backend, "host_sample", None)
        if host_sample is None:
            return
        try:
            row = host_sample()
        except Exception as exc:  # noqa: BLE001 - a sim problem must not stop host sampling
            self.sample_failed(f"simulated host sample failed: {exc.__class__.__name__}: {exc}")
            return  # this machine's readings stay in the snapshot

        def ratio(key: str) -> float | None:
            value = row.get(key)
            return None if value is None or value != value else float(value) / 100.0

        snap.cpu_max_core = ratio("cpu_max_core_pct")
        snap.cpu_avg = ratio("cpu_avg_pct")
        snap.iowait = ratio("iowait_pct")
        bps = row.get("disk_read_bps")
        snap.disk_read_bps = None if bps is None or bps != bps else float(bps)
        snap.extra["simulated"] = True

    def _sample_trainer(self, snap: HostSnapshot, now: float) -> None:
        proc = self._trainer_process(now)
        if proc is None:
            return
        try:
            tree = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            self._trainer = None
            self._proc_cpu = {}
            return
        cpu_now: dict[int, float] = {}
        rss = 0.0
        for p in tree:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    cpu_now[p.pid] = t.user + t.system
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
        if not cpu_now:
            return
        snap.train_pid = proc.pid
        snap.train_rss = rss
        if self._proc_cpu_ts is not None and now > self._proc_cpu_ts:
            used = sum(
                max(0.0, cpu_now[pid] - self._proc_cpu[pid])
                for pid in cpu_now
                if pid in self._proc_cpu
            )
            snap.train_cpu = used / (now - self._proc_cpu_ts)
        self._proc_cpu, self._proc_cpu_ts = cpu_now, now

    def _trainer_process(self, now: float) -> psutil.Process | None:
        if self._trainer is not None:
            try:
                if self._trainer.is_running():
                    return self._trainer
            except psutil.Error:
                pass
            self._trainer = None
            self._proc_cpu, self._proc_cpu_ts = {}, None
        if self._pinned_pid is not None:
            try:
                self._trainer = psutil.Process(int(self._pinned_pid))
            except (psutil.Error, ValueError):
                self._trainer = None
            return self._trainer
        if now < self._next_scan:
            return None
        self._next_scan = now + RESCAN_S
        if now >= self._forget_at:  # processes renamed after start (Ray workers) get re-read
            self._checked.clear()
            self._forget_at = now + FORGET_S
        self._trainer = find_trainer(exclude=self._own, checked=self._checked)
        return self._trainer

    # --- exposition

    def collect(self) -> Iterable[Metric]:
        """Host families from the latest snapshot; unknown values are left out."""
        snap = self.snapshot
        if snap is None:
            return
        gauges = (
            (m.HOST_CPU_MAX_CORE, "Busiest CPU core over the last interval (0..1).",
             snap.cpu_max_core),
            (m.HOST_CPU_AVG, "Mean CPU busy share over all cores, last interval (0..1).",
             snap.cpu_avg),
            (m.HOST_IOWAIT, "Share of CPU time waiting for I/O, last interval (0..1).",
             snap.iowait),
            (m.HOST_MEM_USED, "Host memory in use (total minus available), bytes.",
             snap.mem_used),
            (m.HOST_MEM_TOTAL, "Host memory, bytes.", snap.mem_total),
            (m.TRAIN_PROC_CPU, "CPU used by the verl training process tree (1.0 = one core).",
             snap.train_cpu),
            (m.TRAIN_PROC_RSS, "Resident memory of the verl training process tree, bytes.",
             snap.train_rss),
        )
        for name, doc, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
        counters = (
            (m.HOST_DISK_READ, "Bytes read from disks since boot.", snap.disk_read_bytes),
            (m.HOST_DISK_WRITTEN, "Bytes written to disks since boot.", snap.disk_written_bytes),
            (m.HOST_NET_RX, "Bytes received on non-loopback interfaces.", snap.net_rx_bytes),
            (m.HOST_NET_TX, "Bytes sent on non-loopback interfaces.", snap.net_tx_bytes),
        )
        for name, doc, value in counters:
            if value is not None:
                yield CounterMetricFamily(name.removesuffix("_total"), doc, value=value)
