"""Parsing of NCCL Inspector dumps: one JSON object per completed collective, per line.

NCCL Inspector (NCCL >= 2.28, a profiler plugin) appends to ``<dir>/<hostname>-pid<pid>.log``
objects of the shape ``{"header": {id, comm_name, rank, n_ranks, nnodes}, "metadata":
{inspector_output_format_version, dump_timestamp_us, hostname, pid}, "coll_perf": {coll,
coll_sn, coll_msg_size_bytes, coll_exec_time_us, coll_timing_source, coll_algobw_gbs,
coll_busbw_gbs}}``; point-to-point records carry ``p2p_perf`` with ``p2p_*`` keys instead.
Other records (``dump_stats`` in format v4.1+) are recognised and skipped.

This module only turns text into :class:`NcclRecord`; reading files lives in the collector.
Execution time includes waiting for peers, so a straggler rank shows the *short* time.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

#: Longest dump line accepted (a real record is under 1 KB); longer lines are dropped.
MAX_LINE_BYTES = 64 * 1024
#: ``<hostname>-pid<pid>.log``, the Inspector's dump file name.
DUMP_NAME = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log$")


class NcclParseError(ValueError):
    """A line that is not a usable Inspector record; the message says why in words."""


@dataclass(frozen=True)
class NcclRecord:
    """One completed collective (or point-to-point operation) seen by one rank."""

    coll: str  # "AllReduce", "AllGather", ... or "Send"/"Recv" for P2P
    comm: str  # communicator name when set, else its id
    rank: int | None
    n_ranks: int | None
    msg_bytes: float
    exec_seconds: float
    busbw_bytes_per_s: float | None
    algobw_bytes_per_s: float | None
    ts: float | None  # unix seconds of the dump, None when absent
    hostname: str | None
    pid: int | None
    seq: int | None
    p2p: bool = False

    @property
    def process(self) -> tuple[str | None, int | None]:
        """Which process dumped it (hostname, pid): one rank per process."""
        return (self.hostname, self.pid)


def _num(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NcclParseError(f"{what} is not a number ({value!r})")
    out = float(value)
    if not math.isfinite(out) or out < 0:
        raise NcclParseError(f"{what} is negative or not finite ({value!r})")
    return out


def _opt_num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) and out >= 0 else None


def _opt_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def parse_line(line: str) -> NcclRecord | None:
    """Parse one dump line.

    Returns the record, or None for a well-formed record that carries no operation timing
    (``dump_stats`` and other bookkeeping objects, blank lines). Raises :class:`NcclParseError`
    for anything else (truncated JSON, missing fields, wrong types, JSON nested too deeply,
    lines over ``MAX_LINE_BYTES``): never another exception.
    """
    text = line.strip()
    if not text:
        return None
    if len(text) > MAX_LINE_BYTES:
        raise NcclParseError(f"longer than {MAX_LINE_BYTES} characters")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NcclParseError(f"not JSON ({exc.msg})") from None
    except RecursionError:
        raise NcclParseError("JSON nested too deeply") from None
    except (ValueError, TypeError) as exc:  # e.g. a number too long to convert
        raise NcclParseError(f"not usable JSON ({str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise NcclParseError("not a JSON object")
    header = obj.get("header") if isinstance(obj.get("header"), dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    if isinstance(obj.get("coll_perf"), dict):
        perf, prefix, p2p = obj["coll_perf"], "coll", False
    elif isinstance(obj.get("p2p_perf"), dict):
        perf, prefix, p2p = obj["p2p_perf"], "p2p", True
    elif "header" in obj or "metadata" in obj or "dump_stats" in obj:
        return None
    else:
        raise NcclParseError("neither coll_perf nor p2p_perf in the object")
    coll = perf.get(prefix)
    if not isinstance(coll, str) or not coll:
        raise NcclParseError(f"{prefix} name missing")
    exec_us = _num(perf.get(f"{prefix}_exec_time_us"), f"{prefix}_exec_time_us")
    size = _num(perf.get(f"{prefix}_msg_size_bytes"), f"{prefix}_msg_size_bytes")
    comm = header.get("comm_name") or header.get("id")
    comm = str(comm) if comm not in (None, "") else "unknown"
    busbw = _opt_num(perf.get(f"{prefix}_busbw_gbs"))
    algobw = _opt_num(perf.get(f"{prefix}_algobw_gbs"))
    dump_us = _opt_num(meta.get("dump_timestamp_us"))
    return NcclRecord(
        coll=coll,
        comm=comm,
        rank=_opt_int(header.get("rank")),
        n_ranks=_opt_int(header.get("n_ranks")),
        msg_bytes=size,
        exec_seconds=exec_us / 1e6,
        busbw_bytes_per_s=busbw * 1e9 if busbw is not None else None,
        algobw_bytes_per_s=algobw * 1e9 if algobw is not None else None,
        ts=dump_us / 1e6 if dump_us else None,
        hostname=str(meta["hostname"]) if meta.get("hostname") else None,
        pid=_opt_int(meta.get("pid")),
        seq=_opt_int(perf.get(f"{prefix}_sn")),
        p2p=p2p,
    )


def is_dump_file(path: str | Path) -> bool:
    """True when the file name has the Inspector's ``<hostname>-pid<pid>.log`` shape."""
    return DUMP_NAME.match(Path(path).name) is not None
