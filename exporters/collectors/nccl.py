"""NCCL collector: follows an NCCL Inspector dump directory (``--nccl-dir``).

Every ``*.log`` file in the directory (the Inspector writes ``<hostname>-pid<pid>.log``) is read
incrementally from where the last sample stopped; a truncated or replaced file is read again
from its start. Per collective type and communicator it exports operation, byte and
execution-second counters and the latest bus bandwidth, plus the communication share of wall
time over a trailing window: the execution seconds of the operations dumped in the window,
divided by the window length and by the number of ranks (processes) seen in it. Lines that are
not Inspector records are counted in ``garbage_lines`` and skipped; they never stop the reader.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.nccl_inspector import NcclParseError, NcclRecord, parse_line
from exporters.registry import ExporterContext, register
from exporters.sampling import SampledCollector
from monitor import metric_names as m

#: Most bytes read from one file in one sample (the rest waits for the next sample).
MAX_READ_BYTES = 8 << 20
#: Default trailing window of the communication share, seconds.
DEFAULT_WINDOW_S = 30.0


@dataclass
class _FileState:
    inode: int
    offset: int = 0
    partial: bytes = b""


@dataclass
class _Totals:
    ops: float = 0.0
    bytes: float = 0.0
    exec_s: float = 0.0
    busbw: float | None = None


@dataclass
class NcclSnapshot:
    """What the exposition reads: cumulative totals per (coll, comm) and the latest share."""

    totals: dict[tuple[str, str], _Totals] = field(default_factory=dict)
    comm_share: float | None = None
    files: int = 0


@register("nccl", default=True, help="NCCL Inspector dumps (--nccl-dir): collective counts, "
          "bytes, execution seconds, bus bandwidth, communication share of wall time")
class NcclCollector(SampledCollector):
    """Reads new Inspector lines every interval; never fails on a bad line."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        opts = ctx.options
        self.directory: str | None = getattr(opts, "nccl_dir", None) if opts else None
        self.window_s = float(getattr(opts, "nccl_window", None) or DEFAULT_WINDOW_S)
        self.garbage_lines = 0
        self.records = 0
        self._files: dict[str, _FileState] = {}
        self._totals: dict[tuple[str, str], _Totals] = {}
        # per whole second of dump time: [execution seconds, processes (ranks) seen]
        self._seconds: dict[int, list] = {}
        self.snapshot = NcclSnapshot()

    def sample(self) -> None:
        """Read what the Inspector appended since the last sample and update the snapshot."""
        if not self.directory:
            return
        now = time.time()
        new: list[NcclRecord] = []
        try:
            entries = [e for e in os.scandir(self.directory) if e.name.endswith(".log")]
        except FileNotFoundError:
            entries = []  # not created yet: the job has not started NCCL; wait for it
        seen = set()
        for entry in entries:
            seen.add(entry.path)
            try:
                new.extend(self._read_file(entry.path))
            except OSError:
                continue  # removed between listing and opening; next sample sees the truth
        for gone in set(self._files) - seen:
            del self._files[gone]
        self._account(new, now)

    def _read_file(self, path: str) -> list[NcclRecord]:
        st = os.stat(path)
        state = self._files.get(path)
        if state is None or state.inode != st.st_ino or st.st_size < state.offset:
            state = _FileState(inode=st.st_ino)  # new, replaced or truncated: from the start
            self._files[path] = state
        if st.st_size == state.offset:
            return []
        with open(path, "rb") as fh:
            fh.seek(state.offset)
            chunk = fh.read(MAX_READ_BYTES)
        state.offset += len(chunk)
        data = state.partial + chunk
        lines = data.split(b"\n")
        state.partial = lines.pop()  # incomplete last line waits for its end
        out = []
        for raw in lines:
            try:
                rec = parse_line(raw.decode("utf-8", errors="replace"))
            except NcclParseError:
                self.garbage_lines += 1
                continue
            if rec is not None:
                out.append(rec)
        return out

    def _account(self, new: list[NcclRecord], now: float) -> None:
        delta: dict[tuple[str, str], _Totals] = {}
        for rec in new:
            key = (rec.coll, rec.comm)
            for table in (self._totals, delta):
                tot = table.setdefault(key, _Totals())
                tot.ops += 1
                tot.bytes += rec.msg_bytes
                tot.exec_s += rec.exec_seconds
                if rec.busbw_bytes_per_s is not None:
                    tot.busbw = rec.busbw_bytes_per_s
            ts = rec.ts if rec.ts is not None else now
            bucket = self._seconds.setdefault(int(ts), [0.0, set()])
            bucket[0] += rec.exec_seconds
            bucket[1].add(rec.process)
        self.records += len(new)
        cutoff = now - self.window_s
        for second in [s for s in self._seconds if s < cutoff]:
            del self._seconds[second]
        share = None
        recent = [b for s, b in self._seconds.items() if s <= now + 1.0]
        if recent:
            ranks = len(set().union(*(b[1] for b in recent))) or 1
            busy = sum(b[0] for b in recent)
            share = min(1.0, busy / self.window_s / ranks)
        elif self._totals:
            share = 0.0
        self.snapshot = NcclSnapshot(
            totals={k: _Totals(v.ops, v.bytes, v.exec_s, v.busbw) for k, v in self._totals.items()},
            comm_share=share,
            files=len(self._files),
        )
        if delta and self.ctx.store is not None:
            self.ctx.store.put_nccl([
                {"ts": now, "node": self.ctx.node, "coll": coll, "comm": comm, "ops": t.ops,
                 "bytes": t.bytes, "exec_s": t.exec_s, "busbw_bps": t.busbw}
                for (coll, comm), t in delta.items()
            ])

    def collect(self) -> Iterable[Metric]:
        """NCCL families from the latest snapshot (nothing before the first record)."""
        snap = self.snapshot
        if not snap.totals:
            return
        labels = ["coll", "comm"]
        ops = CounterMetricFamily(m.NCCL_OPS.removesuffix("_total"),
                                  "NCCL operations completed (Inspector records).", labels=labels)
        nbytes = CounterMetricFamily(m.NCCL_BYTES.removesuffix("_total"),
                                     "NCCL message bytes.", labels=labels)
        exec_s = CounterMetricFamily(m.NCCL_EXEC.removesuffix("_total"),
                                     "NCCL execution seconds (includes waiting for peers).",
                                     labels=labels)
        busbw = GaugeMetricFamily(m.NCCL_BUSBW, "Latest NCCL bus bandwidth, bytes per second.",
                                  labels=labels)
        for (coll, comm), tot in sorted(snap.totals.items()):
            ops.add_metric([coll, comm], tot.ops)
            nbytes.add_metric([coll, comm], tot.bytes)
            exec_s.add_metric([coll, comm], tot.exec_s)
            if tot.busbw is not None:
                busbw.add_metric([coll, comm], tot.busbw)
        yield ops
        yield nbytes
        yield exec_s
        yield busbw
        if snap.comm_share is not None:
            yield GaugeMetricFamily(
                m.NCCL_COMM_SHARE,
                f"NCCL execution seconds per rank over the last {self.window_s:g} s of wall time.",
                value=snap.comm_share,
            )
