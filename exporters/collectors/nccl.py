"""NCCL collector: follows an NCCL Inspector dump directory (``--nccl-dir``).

Every ``*.log`` file in the directory (the Inspector writes ``<hostname>-pid<pid>.log``) is read
incrementally from where the last sample stopped; a truncated or replaced file is read again
from its start. Each file's position is saved in the run store with the rows read before it
(``log_positions``, as the verl log's), so an exporter started again resumes there instead of
counting every collective of the run a second time. Per collective type and communicator it exports operation, byte and
execution-second counters and the latest bus bandwidth, plus the communication share of wall
time over a trailing window: the execution seconds of the operations dumped in the window,
divided by the window length and by the number of ranks (processes) seen in it. Lines that are
not Inspector records are counted in ``garbage_lines`` and skipped; they never stop the reader.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.exposition import shorten_label
from exporters.nccl_inspector import MAX_LINE_BYTES, NcclRecord, parse_line
from exporters.registry import ExporterContext, register
from exporters.sampling import SampledCollector
from monitor import metric_names as m
from monitor.live import FlagGroup
from monitor.logs.follow import LogPosition

#: Most bytes read from one file in one sample (the rest waits for the next sample).
MAX_READ_BYTES = 8 << 20
#: Default trailing window of the communication share, seconds.
DEFAULT_WINDOW_S = 30.0
#: Most (coll, comm, rank) series kept; records of further series are counted, not exported.
MAX_SERIES = 4096
#: A series with no new record for this long is forgotten (its communicator is gone).
SERIES_TTL_S = 3600.0
#: Records dated more than this in the future are counted as arriving now.
FUTURE_SLACK_S = 60.0


@dataclass
class _FileState:
    inode: int
    dev: int = 0
    offset: int = 0
    partial: bytes = b""
    dropping: bool = False  # inside a line longer than MAX_LINE_BYTES: skip to its end


@dataclass
class _Totals:
    ops: float = 0.0
    bytes: float = 0.0
    exec_s: float = 0.0
    busbw: float | None = None
    seen: float = 0.0  # wall time of the last record (for pruning)


#: (coll, comm, rank) -- rank as text, "unknown" when the record has none
SeriesKey = tuple[str, str, str]


@dataclass
class NcclSnapshot:
    """What the exposition reads: cumulative totals per (coll, comm, rank), the latest share
    and the drop counters."""

    totals: dict[SeriesKey, _Totals] = field(default_factory=dict)
    comm_share: float | None = None
    files: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


def add_flags(group: FlagGroup) -> None:
    """The nccl collector's flags: the dump directory and the share's window."""
    add = group.add_argument
    add("--nccl-dir", metavar="DIR",
        help="NCCL Inspector dump directory (NCCL_INSPECTOR_DUMP_DIR) to follow")
    add("--nccl-window", type=float, default=DEFAULT_WINDOW_S, metavar="SECONDS",
        help=f"trailing window of the NCCL communication share (default {DEFAULT_WINDOW_S:g})")


@register("nccl", default=True, help="NCCL Inspector dumps (--nccl-dir): collective counts, "
          "bytes, execution seconds and bus bandwidth per rank, communication share of wall "
          "time", flags=add_flags)
class NcclCollector(SampledCollector):
    """Reads new Inspector lines every interval; never fails on a bad line.

    Bounds: a line longer than ``MAX_LINE_BYTES`` is skipped without being held; at most
    ``MAX_SERIES`` (coll, comm, rank) series, each forgotten after ``SERIES_TTL_S`` without a
    record; the share's per-second buckets cover only the trailing window (records dated in
    the future count as now). Every record not exported is counted in ``dropped`` by reason
    (``verlmon_nccl_dropped_total``): ``garbage`` (not a record), ``oversize`` (line too long),
    ``series_cap`` (past ``MAX_SERIES``: the store gets no row for it either, so the store's
    rows per sample follow the same cap); ``future`` counts records whose time was clamped,
    ``long_label`` records whose collective or communicator name was cut to
    ``MAX_LABEL_CHARS`` (exporters/exposition.py) for the labels and the store.
    """

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        self.directory: str | None = ctx.options.nccl_dir
        self.window_s = float(ctx.options.nccl_window or DEFAULT_WINDOW_S)
        self.max_series = MAX_SERIES
        self.series_ttl_s = SERIES_TTL_S
        self.records = 0
        self.dropped = {"garbage": 0, "oversize": 0, "series_cap": 0, "future": 0,
                        "long_label": 0}
        self._files: dict[str, _FileState] = {}
        self._totals: dict[SeriesKey, _Totals] = {}
        # per whole second of dump time: [execution seconds, processes (ranks) seen]
        self._seconds: dict[int, list] = {}
        self.snapshot = NcclSnapshot()
        self._published: dict[str, LogPosition] = {}
        self._resume = self._saved_positions()

    def _saved_positions(self) -> dict[str, LogPosition]:
        """Where the store says each dump file was read up to (restart-safe: an exporter
        started again does not count the same collectives twice)."""
        read = getattr(self.ctx.sink, "saved_log_positions", None)
        if read is None or not self.directory:
            return {}
        try:
            saved = dict(read())
        except Exception:  # noqa: BLE001 - an unreadable store: read the dumps from the start
            return {}
        base = os.path.abspath(self.directory)
        return {path: pos for path, pos in saved.items()
                if os.path.dirname(path) == base and path.endswith(".log")}

    def _publish_positions(self) -> None:
        """Hand each file's position (the end of its last whole line) to the sink, which saves
        it with the rows read before it."""
        save = getattr(self.ctx.sink, "add_log_positions", None)
        if save is None:
            return
        out = []
        for path, state in self._files.items():
            pos = LogPosition(os.path.abspath(path), state.dev, state.inode,
                              state.offset - len(state.partial), 0, "")
            if state.dropping or self._published.get(path) == pos:
                continue
            self._published[path] = pos
            out.append(pos)
        if out:
            save(out)

    @property
    def garbage_lines(self) -> int:
        """Lines that were not Inspector records (skipped)."""
        return self.dropped["garbage"]

    def sample(self) -> None:
        """Read what the Inspector appended since the last sample and update the snapshot."""
        if not self.directory:
            return
        now = self.ctx.clock()  # the wall clock, or a sped-up simulated run's own
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
            self._published.pop(gone, None)
        self._account(new, now)
        self._publish_positions()

    def _read_file(self, path: str) -> list[NcclRecord]:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return []  # a FIFO, device or directory named *.log: not a dump
        state = self._files.get(path)
        if state is None:
            saved = self._resume.pop(os.path.abspath(path), None)
            if saved is not None and (saved.dev, saved.ino) == (st.st_dev, st.st_ino) \
                    and saved.offset <= st.st_size:
                state = _FileState(inode=st.st_ino, dev=st.st_dev, offset=saved.offset)
                self._files[path] = state
        if state is None or state.inode != st.st_ino or st.st_size < state.offset:
            # new, replaced or truncated: from the start
            state = _FileState(inode=st.st_ino, dev=st.st_dev)
            self._files[path] = state
        if st.st_size == state.offset:
            return []
        with open(path, "rb") as fh:
            fh.seek(state.offset)
            chunk = fh.read(MAX_READ_BYTES)
        state.offset += len(chunk)
        lines = chunk.split(b"\n")
        tail = lines.pop()  # incomplete last line waits for its end
        if lines:
            first, state.partial = state.partial + lines[0], b""
            if state.dropping:
                state.dropping = False  # the end of an oversize line: skip it
                lines = lines[1:]
            else:
                lines[0] = first
        if state.dropping:
            pass  # still inside an oversize line: hold nothing
        elif len(state.partial) + len(tail) > MAX_LINE_BYTES:
            self.dropped["oversize"] += 1
            state.partial, state.dropping = b"", True
        else:
            state.partial += tail
        out = []
        for raw in lines:
            if len(raw) > MAX_LINE_BYTES:
                self.dropped["oversize"] += 1
                continue
            try:
                rec = parse_line(raw.decode("utf-8", errors="replace"))
            except Exception:  # noqa: BLE001 - NcclParseError or anything else: this line only
                self.dropped["garbage"] += 1
                continue
            if rec is not None:
                out.append(rec)
        return out

    def _account(self, new: list[NcclRecord], now: float) -> None:
        delta: dict[tuple[str, str], _Totals] = {}
        cutoff = now - self.window_s
        for rec in new:
            coll, comm = shorten_label(rec.coll), shorten_label(rec.comm)
            if coll is not rec.coll or comm is not rec.comm:
                self.dropped["long_label"] += 1
            key = (coll, comm, "unknown" if rec.rank is None else str(rec.rank))
            tot = self._totals.get(key)
            if tot is None:
                if len(self._totals) >= self.max_series:
                    self.dropped["series_cap"] += 1  # neither exported nor stored
                else:
                    tot = self._totals[key] = _Totals()
            if tot is not None:
                tot.seen = now
                for totals in (tot, delta.setdefault((coll, comm), _Totals())):
                    totals.ops += 1
                    totals.bytes += rec.msg_bytes
                    totals.exec_s += rec.exec_seconds
                    if rec.busbw_bytes_per_s is not None:
                        totals.busbw = rec.busbw_bytes_per_s
            ts = rec.ts if rec.ts is not None else now
            if ts > now + FUTURE_SLACK_S:
                self.dropped["future"] += 1
                ts = now
            if ts < cutoff:
                continue  # too old for the share: no bucket for it
            bucket = self._seconds.setdefault(int(ts), [0.0, set()])
            bucket[0] += rec.exec_seconds
            bucket[1].add(rec.process)
        self.records += len(new)
        for second in [s for s in self._seconds if s < cutoff]:
            del self._seconds[second]
        stale = now - self.series_ttl_s
        for key in [k for k, t in self._totals.items() if t.seen < stale]:
            del self._totals[key]
        share = None
        recent = [b for s, b in self._seconds.items() if s <= now + 1.0]
        if recent:
            ranks = len(set().union(*(b[1] for b in recent))) or 1
            busy = sum(b[0] for b in recent)
            share = min(1.0, busy / self.window_s / ranks)
        elif self._totals:
            share = 0.0
        self.snapshot = NcclSnapshot(
            totals={k: _Totals(v.ops, v.bytes, v.exec_s, v.busbw, v.seen)
                    for k, v in self._totals.items()},
            comm_share=share,
            files=len(self._files),
            dropped=dict(self.dropped),
        )
        if delta:
            self.ctx.sink.add_nccl([
                {"ts": now, "node": self.ctx.node, "coll": coll, "comm": comm, "ops": t.ops,
                 "bytes": t.bytes, "exec_s": t.exec_s, "busbw_bps": t.busbw}
                for (coll, comm), t in delta.items()
            ])

    def collect(self) -> Iterable[Metric]:
        """NCCL families from the latest snapshot (nothing before the first record).

        Per (coll, comm, rank): a rank that waits for its peers shows a long execution time,
        the straggler a short one, so both stay visible."""
        snap = self.snapshot
        if snap.dropped:
            dropped = CounterMetricFamily(
                m.NCCL_DROPPED.removesuffix("_total"),
                "NCCL dump records not exported: garbage (not a record), oversize (line too "
                "long), series_cap (too many series: neither exported nor stored); future: "
                "records dated ahead, counted as now; long_label: collective or communicator "
                "names over 128 characters, kept shortened.", labels=["reason"])
            for reason, count in sorted(snap.dropped.items()):
                dropped.add_metric([reason], count)
            yield dropped
        if not snap.totals:
            return
        labels = ["coll", "comm", "rank"]
        ops = CounterMetricFamily(m.NCCL_OPS.removesuffix("_total"),
                                  "NCCL operations completed (Inspector records).", labels=labels)
        nbytes = CounterMetricFamily(m.NCCL_BYTES.removesuffix("_total"),
                                     "NCCL message bytes.", labels=labels)
        exec_s = CounterMetricFamily(m.NCCL_EXEC.removesuffix("_total"),
                                     "NCCL execution seconds (includes waiting for peers: the "
                                     "rank that waits is long, the straggler short).",
                                     labels=labels)
        busbw = GaugeMetricFamily(m.NCCL_BUSBW, "Latest NCCL bus bandwidth, bytes per second.",
                                  labels=labels)
        for key, tot in sorted(snap.totals.items()):
            values = list(key)
            ops.add_metric(values, tot.ops)
            nbytes.add_metric(values, tot.bytes)
            exec_s.add_metric(values, tot.exec_s)
            if tot.busbw is not None:
                busbw.add_metric(values, tot.busbw)
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
