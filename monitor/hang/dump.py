"""Read a PyTorch Flight Recorder dump into a typed summary.

A rank asked through ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` writes its Flight Recorder to
``TORCH_FR_DUMP_TEMP_FILE<rank>`` as a pickle of plain containers (seen with torch 2.11, dump
version "2.10"): ``version``, ``comm_lib_version``, ``pg_config`` (per process group: ``name``,
``desc``, ``ranks`` as text), ``pg_status`` (per process group: ``last_enqueued_collective``,
``last_started_collective`` (-1 unless ``TORCH_NCCL_ENABLE_TIMING=1``),
``last_completed_collective``) and ``entries``, each with ``collective_seq_id``, ``pg_id``,
``process_group`` (name, desc), ``profiling_name`` (``nccl:all_reduce``), ``state``
(scheduled / started / completed), sizes, times and ``frames`` (name, filename, line).

The file comes from another process, so it is read with an unpickler that refuses every
class: only dicts, lists, tuples, strings and numbers load, and anything else is a
:class:`DumpError` in words. So is data nested deeper than ``MAX_DEPTH`` (a 400 KB pickle of
lists inside lists loads, then raises RecursionError wherever it is printed or compared).
Only a regular file inside the dump directory is opened, without following a link and
without blocking (a FIFO named like a dump is refused, not waited on).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.logs.safe_read import walk_files

#: Largest dump read, bytes (2,000 entries with frames are ~300 KB; this leaves room).
MAX_DUMP_BYTES = 64 * 1024 * 1024

#: Deepest nesting of containers read (a real dump nests 6 deep: dict, entries, entry,
#: frames, frame, value).
MAX_DEPTH = 32
#: Most containers and values in one dump (2,000 entries with 20 frames are ~300,000).
MAX_NODES = 5_000_000

#: Frames in these paths belong to PyTorch itself; the caller's frame is the first other one.
_LIBRARY_PARTS = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/utils/", "/torch/_",
                  "/torch/cuda/", "/torch/autograd/", "/torch/nn/modules/")


class DumpError(ValueError):
    """The file is not a Flight Recorder dump this reader understands; the text says why."""


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain containers only: any class or function in the stream is refused."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        raise DumpError(f"the dump asks for {module}.{name}; only plain data is read")


@dataclass(frozen=True)
class Frame:
    """One Python frame: function name, file and line."""

    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}:{self.line})"


@dataclass(frozen=True)
class Pending:
    """A collective enqueued but not completed on this rank."""

    seq: int
    name: str  # profiling name, e.g. nccl:all_reduce
    state: str  # scheduled | started
    sizes: list = field(default_factory=list)
    frame: Frame | None = None  # the caller's frame that issued it
    created_ns: int | None = None


@dataclass(frozen=True)
class GroupStatus:
    """One process group on one rank."""

    pg: str  # the process group's name (pg_status key)
    desc: str
    ranks: tuple[int, ...]
    enqueued: int
    started: int  # -1 where the dump does not track it
    completed: int
    pending: tuple[Pending, ...] = ()
    last_frame: Frame | None = None  # frame of the newest entry of this group


@dataclass(frozen=True)
class RankDump:
    """A rank's dump: where each of its process groups stands."""

    rank: int
    version: str
    groups: dict[str, GroupStatus]
    path: str = ""


def caller_frame(frames: list[dict[str, Any]] | None) -> Frame | None:
    """The first frame outside PyTorch's own code (the line in the job that issued the call)."""
    parsed = []
    for fr in frames or []:
        try:
            parsed.append(Frame(str(fr.get("name", "?")), str(fr.get("filename", "?")),
                                int(fr.get("line", 0) or 0)))
        except (AttributeError, TypeError, ValueError):
            continue
    for fr in parsed:
        if not any(part in fr.filename for part in _LIBRARY_PARTS):
            return fr
    return parsed[0] if parsed else None


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _ranks(text: Any) -> tuple[int, ...]:
    if isinstance(text, (list, tuple)):
        return tuple(_int(v) for v in text)
    return tuple(int(x) for x in re.findall(r"-?\d+", str(text or "")))


def check_shape(obj: Any) -> None:
    """Raise :class:`DumpError` for data nested deeper than ``MAX_DEPTH`` or holding more than
    ``MAX_NODES`` values (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise DumpError(f"more than {MAX_NODES} values: not a Flight Recorder dump")
        if isinstance(item, dict):
            children: Any = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth >= MAX_DEPTH and children:
            raise DumpError(f"data nested deeper than {MAX_DEPTH} levels: not a Flight "
                            "Recorder dump")
        stack.extend((c, depth + 1) for c in children)


def parse_dump(data: bytes, rank: int, path: str = "") -> RankDump:
    """Summarise one dump's bytes; raises :class:`DumpError` in words when it is not one."""
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{len(data)} bytes, over the {MAX_DUMP_BYTES} read")
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except DumpError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure is one message
        raise DumpError(f"not a whole pickle ({exc.__class__.__name__}: "
                        f"{str(exc)[:200]})") from None
    check_shape(obj)
    try:
        return _summarise(obj, rank, path)
    except RecursionError:
        raise DumpError("data nested too deep to read: not a Flight Recorder dump") from None


def _summarise(obj: Any, rank: int, path: str) -> RankDump:
    if not isinstance(obj, dict) or not isinstance(obj.get("pg_status"), dict):
        raise DumpError("no pg_status: not a Flight Recorder dump")
    config = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    entries = obj.get("entries") if isinstance(obj.get("entries"), list) else []
    by_pg: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group")
        name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", ""))
        by_pg.setdefault(name, []).append(e)
    groups: dict[str, GroupStatus] = {}
    for pg, st in obj["pg_status"].items():
        if not isinstance(st, dict):
            continue
        pg = str(pg)
        cfg = config.get(pg, {}) if isinstance(config.get(pg, {}), dict) else {}
        completed = _int(st.get("last_completed_collective"))
        ents = sorted(by_pg.get(pg, []), key=lambda e: _int(e.get("collective_seq_id"), 0))
        pending = tuple(
            Pending(seq=_int(e.get("collective_seq_id")), name=str(e.get("profiling_name", "?")),
                    state=str(e.get("state", "?")), sizes=list(e.get("input_sizes") or []),
                    frame=caller_frame(e.get("frames")),
                    created_ns=_int(e.get("time_created_ns"), 0) or None)
            for e in ents
            if e.get("state") != "completed" and _int(e.get("collective_seq_id")) > completed)
        groups[pg] = GroupStatus(
            pg=pg, desc=str(cfg.get("desc", "")), ranks=_ranks(cfg.get("ranks")),
            enqueued=_int(st.get("last_enqueued_collective")),
            started=_int(st.get("last_started_collective")), completed=completed,
            pending=pending, last_frame=caller_frame(ents[-1].get("frames")) if ents else None)
    return RankDump(rank=rank, version=str(obj.get("version", "")), groups=groups, path=path)


def _inside(path: str, root: str) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def read_dump_bytes(path: str | Path, root: str | Path | None = None) -> bytes:
    """The bytes of the dump file ``path``, opened without following a link and without
    blocking (``O_NOFOLLOW | O_NONBLOCK``): a link, a FIFO, a device or a directory named like a
    dump, a file whose real path lies outside ``root``, or one over ``MAX_DUMP_BYTES``, is a
    :class:`DumpError` saying so."""
    p = str(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        if os.path.islink(p):
            raise DumpError(f"{p}: a symbolic link; dumps are read only as regular files "
                            "inside the dump directory") from None
        raise DumpError(f"{p}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DumpError(f"{p}: not a regular file (a FIFO, device or directory named like "
                            "a dump); not read")
        if root is not None:
            if not _inside(p, str(root)):
                raise DumpError(f"{p}: lies outside {root} (through a linked folder); not read")
            real = os.stat(os.path.realpath(p))
            if (real.st_dev, real.st_ino) != (st.st_dev, st.st_ino):
                raise DumpError(f"{p}: replaced while it was opened; not read")
        if st.st_size > MAX_DUMP_BYTES:
            raise DumpError(f"{p}: {st.st_size} bytes, over the {MAX_DUMP_BYTES} read")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_DUMP_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise DumpError(f"{p}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_dump(path: str | Path, rank: int | None = None,
              root: str | Path | None = None) -> RankDump:
    """Read ``path`` (a ``<prefix><rank>`` file); the rank is taken from the name if not given.
    With ``root``, the file must lie inside that directory (see :func:`read_dump_bytes`)."""
    p = Path(path)
    if rank is None:
        m = re.search(r"(\d+)$", p.name)
        if not m:
            raise DumpError(f"{p.name}: no rank number at the end of the file name")
        rank = int(m.group(1))
    return parse_dump(read_dump_bytes(p, root), rank, str(p))


def read_dump_dir(directory: str | Path, prefix: str = "fr_"
                  ) -> tuple[dict[int, RankDump], dict[int, str]]:
    """Every ``<prefix><rank>`` dump under ``directory`` (searched recursively: the dumps of all
    nodes copied into one folder, or one sub-folder per node); (dumps, rank -> why unreadable).
    Only regular files inside ``directory`` are read (no link is followed, no FIFO opened);
    the folder is walked without recursion (``monitor.logs.safe_read.walk_files``)."""
    dumps: dict[int, RankDump] = {}
    problems: dict[int, str] = {}
    pat = re.compile(re.escape(prefix) + r"(\d+)$")
    for path in sorted(walk_files(directory, lambda name: pat.match(name) is not None)):
        m = pat.match(path.name)
        if not m:
            continue
        rank = int(m.group(1))
        try:
            dumps[rank] = read_dump(path, rank, root=directory)
        except DumpError as exc:
            problems[rank] = str(exc)
    return dumps, problems
