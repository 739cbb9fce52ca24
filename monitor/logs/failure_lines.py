"""The failures that end verl runs, recognised in one log line each, with their numbers.

Pure functions over text: ``match_failure`` turns a line into a ``Failure`` (an event kind, the
numbers the line gives, whether it ends the run), ``oom_details`` reads a CUDA out-of-memory
message, ``traceback_phase`` names the verl phase a traceback was in, ``traceback_origin`` its
Ray task and deepest frames. The parser
(``monitor.logs.canonical_records``) calls them; nothing here keeps state.

Event kinds (``FAILURE_KINDS``) and what their ``data`` holds:

- ``nccl_timeout``: the NCCL watchdog gave up on a collective: ``collective`` (ALLREDUCE, ...),
  ``seq``, ``timeout_s``, ``ran_s``, ``rank``; or its heartbeat found it stuck: ``stuck_s``.
- ``nccl_error``: an NCCL call failed: ``code`` (``ncclUnhandledCudaError``, ``ncclRemoteError``,
  ``ncclSystemError``, ``ncclInternalError``, ``ncclInvalidUsage``, ...), ``detail``,
  ``nccl_version``, ``rank``.
- ``actor_died``: Ray lost an actor or a task failed: ``exception`` (``ActorDiedError``,
  ``RayActorError``, ``RayTaskError``), ``cause`` (the wrapped exception), ``task``.
- ``worker_killed``: a process was killed or crashed: ``reason`` (``host_oom``, ``sigkill``,
  ``segfault``, ``abort``, ``bus_error``, ``system_error``), ``exit_type``, ``pid``, ``count``.
- ``cuda_error``: the GPU or a kernel failed: ``error`` (``illegal memory access``,
  ``device-side assert``, ``ECC``, ``launch failure``, ``Xid``, ...), ``xid``, ``pci``.

``data["fatal"]`` is False for the few lines that do not end a run on their own (a Ray worker
that exited on purpose, an XID code that is not a hardware failure).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAILURE_KINDS: tuple[str, ...] = (
    "nccl_timeout",
    "nccl_error",
    "actor_died",
    "worker_killed",
    "cuda_error",
)

#: A cheap first test: only lines holding one of these words are looked at closely.
_NEEDLE_RE = re.compile(
    r"atchdog|nccl|NCCL [Ee]rror|NCCL communicator|ActorDiedError|RayActorError|RayTaskError|"
    r"Unhandled error|"
    r"actor died|actor is dead|SIG(?:KILL|SEGV|ABRT|BUS)|Segmentation fault|[Bb]us error|"
    r"\d Killed |"
    r"Worker exit type|worker died|memory pressure|Killed process|running low on memory|"
    r"CUDA error|illegal memory access|Xid|ECC error|fallen off the bus|MEM\(GB\)"
)

_RANK_RE = re.compile(r"\[(?:PG [^\]]*?)?[Rr]ank ?(\d+)\]|\brank(\d+)\]")
_WATCHDOG_RE = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
    r"(?:, NumelIn=(\d+), NumelOut=(\d+))?, Timeout\(ms\)=(\d+)\)"
    r"(?: ran for (\d+) milliseconds)?"
)
_WATCHDOG_STUCK_RE = re.compile(r"watchdog got stuck for (\d+) seconds")
_NCCL_CODE_RE = re.compile(
    r"\b(ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidArgument|"
    r"ncclInvalidUsage|ncclRemoteError|ncclInProgress)\b:?\s*([^.]*)"
)
_NCCL_VERSION_RE = re.compile(r"NCCL version ([\w.+-]+)")
_NCCL_WHAT_END_RE = re.compile(r" \(run with| - |, NCCL version|\. |\.$")
_NCCL_NUMBER_RE = re.compile(r" (\d+)(?=:)")
_NCCL_TEXT_CODES = {
    "unhandled cuda error": "ncclUnhandledCudaError",
    "unhandled system error": "ncclSystemError",
    "internal error": "ncclInternalError",
    "invalid argument": "ncclInvalidArgument",
    "invalid usage": "ncclInvalidUsage",
    "remote process exited or there was a network error": "ncclRemoteError",
}
_NCCL_ABORT_RE = re.compile(r"NCCL communicator was aborted(?: on rank (\d+))?")
_RAY_TASK_RE = re.compile(r"RayTaskError\((\w+)\)(?::\s*ray::([\w.<>]+)\(\))?")
_RAY_UNHANDLED_RE = re.compile(r"Unhandled error \(suppress with [^)]*\): ray::([\w.<>]+)\(\)")
_RAY_ACTOR_RE = re.compile(r"\b(ActorDiedError|RayActorError)\b")
_EXIT_TYPE_RE = re.compile(r"Worker exit type: (\w+)(?: Worker exit detail: ([^.]*\.?))?")
_MEM_PRESSURE_RE = re.compile(
    r"(\d+) Workers? \(tasks / actors\) killed due to memory pressure \(OOM\)"
)
_KERNEL_OOM_RE = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)")
#: The table of top memory users Ray's memory monitor prints when it kills a worker.
_RAY_MEMORY_TABLE_RE = re.compile(r"^PID\s+MEM\(GB\)\s+COMMAND\b")
_SHELL_KILLED_RE = re.compile(r"line \d+: +(\d+) Killed\s")
_PID_RE = re.compile(r"\b(?:PID|pid)[:= ]+(\d+)")
_XID_RE = re.compile(r"Xid \(PCI:([\w:.]+)\): (\d+)")
_CUDA_ERROR_RE = re.compile(r"CUDA error: ([^.\n]+)")

#: XID codes that mean the GPU or its memory failed (the others are mostly application faults).
FATAL_XIDS: frozenset[int] = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


@dataclass
class Failure:
    """A recognised failure line: the event kind, its numbers, and a key for de-duplication
    (the same failure is printed more than once, e.g. in the log line and in the exception)."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    signature: tuple[Any, ...] = ()


def _rank(text: str) -> int | None:
    match = _RANK_RE.search(text)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def _nccl_timeout(text: str) -> Failure | None:
    match = _WATCHDOG_RE.search(text)
    if match is not None:
        seq, op, numel_in, _numel_out, timeout_ms, ran_ms = match.groups()
        data: dict[str, Any] = {
            "collective": op,
            "seq": int(seq),
            "timeout_s": int(timeout_ms) / 1000.0,
            "ran_s": None if ran_ms is None else int(ran_ms) / 1000.0,
            "numel": None if numel_in is None else int(numel_in),
            "rank": _rank(text),
            "fatal": True,
        }
        return Failure("nccl_timeout", data, ("timeout", int(seq), op, data["rank"]))
    match = _WATCHDOG_STUCK_RE.search(text)
    if match is not None:
        data = {"stuck_s": float(match.group(1)), "rank": _rank(text), "fatal": True}
        return Failure("nccl_timeout", data, ("stuck", data["rank"]))
    return None


def _cuda_error(text: str) -> Failure | None:
    match = _XID_RE.search(text)
    if match is not None:
        xid = int(match.group(2))
        data = {"error": "Xid", "xid": xid, "pci": match.group(1), "fatal": xid in FATAL_XIDS}
        return Failure("cuda_error", data, ("xid", xid, match.group(1)))
    if "fallen off the bus" in text:
        return Failure("cuda_error", {"error": "GPU fallen off the bus", "xid": 79,
                                      "fatal": True}, ("xid", 79))
    error: str | None = None
    if "illegal memory access" in text:
        error = "illegal memory access"
    elif "device-side assert" in text:
        error = "device-side assert"
    elif "ECC error" in text:
        error = "ECC"
    elif "CUDA error" in text:
        match = _CUDA_ERROR_RE.search(text)
        if match is None:
            return None
        error = match.group(1).strip().rstrip("'\"")
        if error.startswith("out of memory"):
            return None  # an OOM: the parser's oom event, not a failure
        if "launch failure" in error:
            error = "launch failure"
    if error is None:
        return None
    rank = _rank(text)
    return Failure("cuda_error", {"error": error, "rank": rank, "fatal": True},
                   ("cuda", error, rank))


def _nccl_said(text: str) -> tuple[str | None, str | None, str | None]:
    """``(code, what, version)`` from PyTorch's "NCCL error in: <file>:<line>, <what> (run
    with NCCL_DEBUG=INFO for details), NCCL version <v>" or vLLM's "NCCL error: <what>"."""
    at = text.find("NCCL error")
    if at < 0:
        at = text.find("NCCL Error")
        if at < 0:
            return None, None, None
    rest = text[at + len("NCCL error"):]
    if rest.startswith(" in: "):
        rest = rest.split(",", 1)[1] if "," in rest else ""
    number = _NCCL_NUMBER_RE.match(rest)  # "NCCL Error 2: unhandled system error"
    if number is not None:
        rest = rest[number.end():]
    rest = rest.lstrip(":, ")
    version = _NCCL_VERSION_RE.search(rest)
    what = _NCCL_WHAT_END_RE.split(rest, maxsplit=1)[0].strip() or None
    code = _NCCL_TEXT_CODES.get(what.lower()) if what else None
    return code, what, version.group(1) if version else None


def _nccl_error(text: str) -> Failure | None:
    match = _NCCL_CODE_RE.search(text)
    code = detail = None
    if match is not None:
        code, detail = match.group(1), match.group(2).strip() or None
    said_code, what, version = _nccl_said(text)
    if what is not None:
        code = code or said_code or "ncclError"
        detail = what if said_code or not detail else detail
    if code is None:
        abort = _NCCL_ABORT_RE.search(text)
        if abort is None:
            return None
        rank = int(abort.group(1)) if abort.group(1) else _rank(text)
        data = {"code": "aborted", "detail": "NCCL communicator was aborted", "rank": rank,
                "fatal": True}
        return Failure("nccl_error", data, ("nccl", "aborted", rank))
    rank = _rank(text)
    data = {"code": code, "detail": detail, "nccl_version": version, "rank": rank, "fatal": True}
    return Failure("nccl_error", data, ("nccl", code, rank))


def _worker_killed(text: str) -> Failure | None:
    match = _MEM_PRESSURE_RE.search(text)
    if match is not None:
        count = int(match.group(1))
        data = {"reason": "host_oom", "count": count, "fatal": True,
                "detail": "Ray killed workers because the node ran low on memory"}
        return Failure("worker_killed", data, ("host_oom", "ray", count))
    if "running low on memory" in text:
        pid = _PID_RE.search(text)
        data = {"reason": "host_oom", "pid": int(pid.group(1)) if pid else None, "fatal": True,
                "detail": "Ray killed a task because the node ran low on memory"}
        return Failure("worker_killed", data, ("host_oom", "task", data["pid"]))
    if _RAY_MEMORY_TABLE_RE.search(text.strip()):
        data = {"reason": "host_oom", "fatal": True,
                "detail": "Ray's memory monitor listed the node's top memory users, the table "
                          "it prints when it kills a worker for lack of host memory"}
        return Failure("worker_killed", data, ("host_oom", "table"))
    match = _KERNEL_OOM_RE.search(text)
    if match is not None:
        data = {"reason": "host_oom", "pid": int(match.group(1)), "process": match.group(2),
                "fatal": True, "detail": "the kernel's OOM killer killed the process"}
        return Failure("worker_killed", data, ("host_oom", "kernel", data["pid"]))
    match = _EXIT_TYPE_RE.search(text)
    if match is not None:
        exit_type, detail = match.group(1), (match.group(2) or "").strip() or None
        reason = "system_error"
        if exit_type == "NODE_OUT_OF_MEMORY":
            reason = "host_oom"
        elif exit_type.startswith("INTENDED"):
            reason = "intended_exit"
        data = {"reason": reason, "exit_type": exit_type, "detail": detail,
                "fatal": not exit_type.startswith("INTENDED")}
        return Failure("worker_killed", data, ("exit", exit_type))
    if "worker died" in text and "unexpected system error" in text:
        data = {"reason": "system_error", "fatal": True,
                "detail": "a Ray worker died or was killed by an unexpected system error"}
        return Failure("worker_killed", data, ("exit", "raylet"))
    match = _SHELL_KILLED_RE.search(text)
    if match is not None:
        data = {"reason": "sigkill", "pid": int(match.group(1)), "fatal": True,
                "detail": "the shell reports the process Killed (SIGKILL)"}
        return Failure("worker_killed", data, ("signal", "sigkill", data["pid"]))
    if "causes include" in text or "root causes" in text:
        return None  # Ray's list of what might have happened, not a report that it did
    reason = None
    if "SIGSEGV" in text or "Segmentation fault" in text:
        reason = "segfault"
    elif "SIGBUS" in text or "us error" in text:
        reason = "bus_error"
    elif "SIGKILL" in text:
        reason = "sigkill"
    elif "SIGABRT" in text:
        reason = "abort"
    if reason is None:
        return None
    pid = _PID_RE.search(text)
    data = {"reason": reason, "pid": int(pid.group(1)) if pid else None, "fatal": True}
    return Failure("worker_killed", data, ("signal", reason, data["pid"]))


def _actor_died(text: str) -> Failure | None:
    match = _RAY_TASK_RE.search(text)
    if match is not None:
        cause, task = match.groups()
        if cause == "OutOfMemoryError":
            return None  # a CUDA OOM re-raised by Ray: the oom event says it
        data = {"exception": "RayTaskError", "cause": cause, "task": task, "fatal": True}
        return Failure("actor_died", data, ("task", cause, task))
    match = _RAY_UNHANDLED_RE.search(text)
    if match is not None:
        data = {"exception": "RayTaskError", "cause": "unhandled error", "task": match.group(1),
                "fatal": True}
        return Failure("actor_died", data, ("task", "unhandled", match.group(1)))
    match = _RAY_ACTOR_RE.search(text)
    if match is not None:
        data = {"exception": match.group(1), "cause": None, "task": None, "fatal": True}
        return Failure("actor_died", data, ("actor", match.group(1)))
    if "actor died unexpectedly" in text or "actor is dead" in text:
        data = {"exception": "ActorDiedError", "cause": None, "task": None, "fatal": True}
        return Failure("actor_died", data, ("actor", "ActorDiedError"))
    return None


#: Tried in this order: a line can mention several (a watchdog line quoting a CUDA error).
_MATCHERS: tuple[Callable[[str], Failure | None], ...] = (
    _nccl_timeout,
    _cuda_error,
    _nccl_error,
    _worker_killed,
    _actor_died,
)


def match_failure(text: str) -> Failure | None:
    """The failure one log line reports, or None (most lines: cheap)."""
    if _NEEDLE_RE.search(text) is None:
        return None
    for matcher in _MATCHERS:
        found = matcher(text)
        if found is not None:
            return found
    return None


# --- CUDA out of memory -------------------------------------------------------------------------

_SIZE = r"([\d.]+) ?([KMGT]i?B|B)"
_TRIED_RE = re.compile(r"Tried to allocate " + _SIZE)
_FREE_NEW_RE = re.compile(
    r"GPU (\d+) has a total capacit(?:y|ies) of " + _SIZE + r" of which " + _SIZE + r" is free"
)
_FREE_OLD_RE = re.compile(r"\(GPU (\d+); " + _SIZE + r" total capacity; (?:" + _SIZE
                          + r" already allocated; )?" + _SIZE + r" free")
_ALLOCATED_RE = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_UNIT_GIB = {"B": 2**-30, "KiB": 2**-20, "KB": 2**-20, "MiB": 2**-10, "MB": 2**-10,
             "GiB": 1.0, "GB": 1.0, "TiB": 1024.0, "TB": 1024.0}

#: Phrases that mark an out-of-memory error on the GPU.
OOM_MARKERS: tuple[str, ...] = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "No available memory for the cache blocks",
)


def _gib(amount: str, unit: str) -> float:
    return float(amount) * _UNIT_GIB.get(unit, 1.0)


def is_oom(text: str) -> bool:
    """True for a line reporting a GPU out-of-memory error (PyTorch, CUDA or vLLM's cache;
    CUDA's own message in any case: vLLM's cumem allocator prints ``cuda error: out of
    memory``)."""
    if any(marker in text for marker in OOM_MARKERS):
        return True
    return "out of memory" in text and "cuda error: out of memory" in text.lower()


def oom_details(text: str) -> dict[str, Any]:
    """What an out-of-memory message says: ``tried_gib``, ``gpu``, ``total_gib``, ``free_gib``,
    ``allocated_gib`` (by PyTorch); only the ones it gives."""
    data: dict[str, Any] = {}
    match = _TRIED_RE.search(text)
    if match is not None:
        data["tried_gib"] = _gib(*match.groups())
    match = _FREE_NEW_RE.search(text)
    if match is not None:
        data["gpu"] = int(match.group(1))
        data["total_gib"] = _gib(match.group(2), match.group(3))
        data["free_gib"] = _gib(match.group(4), match.group(5))
    else:
        match = _FREE_OLD_RE.search(text)
        if match is not None:
            g = match.groups()
            data["gpu"] = int(g[0])
            data["total_gib"] = _gib(g[1], g[2])
            if g[3] is not None:
                data["allocated_gib"] = _gib(g[3], g[4])
            data["free_gib"] = _gib(g[5], g[6])
    match = _ALLOCATED_RE.search(text)
    if match is not None:
        data["allocated_gib"] = _gib(*match.groups())
    if "No available memory for the cache blocks" in text:
        data["where"] = "rollout engine KV cache"
    return data


# --- the phase a traceback was in ---------------------------------------------------------------

#: verl worker methods (and Ray task names ending in them) -> canonical phase.
PHASE_FUNCTIONS: dict[str, str] = {
    "generate_sequences": "gen",
    "compute_log_prob": "old_log_prob",
    "compute_ref_log_prob": "ref",
    "compute_values": "values",
    "update_critic": "update_critic",
    "update_actor": "update_actor",
    "compute_rm_score": "reward",
    "update_weights": "reshard",
    "sync_rollout_weights": "reshard",
    "rollout_mode": "reshard",
    "save_checkpoint": "save_checkpoint",
}
_FRAME_FN_RE = re.compile(r'File "[^"]*", line \d+, in (\w+)')
_TASK_FN_RE = re.compile(r"ray::\w+\.(\w+)\(\)")


def function_phase(name: str) -> str | None:
    """The canonical phase of a verl worker method or Ray task name (``actor_rollout_`` and
    similar prefixes allowed), None when it names none."""
    if name in PHASE_FUNCTIONS:
        return PHASE_FUNCTIONS[name]
    for fn, phase in PHASE_FUNCTIONS.items():
        if name.endswith("_" + fn):
            return phase
    return None


def traceback_phase(lines: list[str]) -> tuple[str, str] | None:
    """``(function, phase)`` for the innermost verl method a traceback names (frames
    ``in compute_log_prob``, Ray task names ``ray::WorkerDict.actor_rollout_update_actor()``);
    None when no frame names a phase."""
    found: tuple[str, str] | None = None
    for line in lines:
        if "line " in line and ", in " in line:
            match = _FRAME_FN_RE.search(line)
            if match is not None:
                phase = function_phase(match.group(1))
                if phase is not None:
                    found = (match.group(1), phase)
                continue
        if "ray::" in line:
            match = _TASK_FN_RE.search(line)
            if match is not None:
                phase = function_phase(match.group(1))
                if phase is not None:
                    found = (match.group(1), phase)
    return found


def describe(kind: str, data: dict[str, Any]) -> str:
    """One short sentence for a failure event (used in flag evidence)."""
    rank = data.get("rank")
    on_rank = f" on rank {rank}" if rank is not None else ""
    if kind == "nccl_timeout":
        if data.get("stuck_s") is not None:
            return f"the NCCL watchdog was stuck for {data['stuck_s']:.0f} s{on_rank}"
        ran = data.get("ran_s")
        timeout = data.get("timeout_s")
        text = (f"NCCL watchdog timeout{on_rank}: {data.get('collective')} "
                f"(sequence number {data.get('seq')})")
        if ran is not None:
            text += f" ran {_duration(ran)}"
        if timeout is not None:
            text += f" against a {_duration(timeout)} timeout"
        return text
    if kind == "nccl_error":
        detail = f" ({data['detail']})" if data.get("detail") else ""
        return f"NCCL error {data.get('code')}{detail}{on_rank}"
    if kind == "actor_died":
        if data.get("exception") == "RayTaskError":
            task = f" in {data['task']}" if data.get("task") else ""
            return f"a Ray task failed with {data.get('cause')}{task}"
        return f"a Ray actor died ({data.get('exception')})"
    if kind == "worker_killed":
        reasons = {
            "host_oom": "killed for lack of host memory",
            "sigkill": "killed by SIGKILL",
            "segfault": "crashed with a segmentation fault",
            "abort": "aborted (SIGABRT)",
            "bus_error": "crashed with a bus error (SIGBUS)",
            "system_error": "died of a system error",
            "intended_exit": "exited on purpose",
        }
        pid = f" (pid {data['pid']})" if data.get("pid") is not None else ""
        count = f"{data['count']} worker(s)" if data.get("count") else "a worker"
        exit_type = f", exit type {data['exit_type']}" if data.get("exit_type") else ""
        detail = f" ({data['detail'].rstrip('.')})" if data.get("exit_type") and data.get(
            "detail") else ""
        return f"{count}{pid} {reasons.get(data.get('reason', ''), 'died')}{exit_type}{detail}"
    if kind == "cuda_error":
        if data.get("error") == "Xid":
            return f"GPU XID {data.get('xid')} on {data.get('pci')}"
        return f"CUDA error: {data.get('error')}{on_rank}"
    return kind


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 60 < 1:
        return f"{seconds / 3600:.1f} h" if seconds % 3600 else f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# --- where a traceback happened (issue 28 item 10) ----------------------------------------------

_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in ([\w<>.]+)')
_RAY_TASK_LINE_RE = re.compile(r"RayTaskError\((\w+)\): ray::([\w.<>]+)\(\)")
_PATH_ROOTS = ("/site-packages/", "/dist-packages/")
_CARETS_ONLY_RE = re.compile(r"[~^]+")
#: Frames a traceback event keeps (the deepest), and the characters of a source line.
MAX_FRAMES = 12
SOURCE_CHARS = 300


def short_path(path: str) -> str:
    """A frame's file without the install prefix: ``.../site-packages/torch/x.py`` ->
    ``torch/x.py``, ``/work/verl/verl/workers/fsdp_workers.py`` -> ``verl/workers/...``."""
    for root in _PATH_ROOTS:
        at = path.rfind(root)
        if at >= 0:
            return path[at + len(root):]
    at = path.rfind("/verl/")
    if at >= 0:
        return path[at + 1:]
    return path


def _is_verl(path: str) -> bool:
    return "/verl/" in path or path.startswith("verl/")


def traceback_origin(lines: list[str]) -> dict[str, Any]:
    """Where a traceback happened: ``task`` (the innermost Ray task of a ``RayTaskError(X):
    ray::Actor.method()`` line, e.g. ``WorkerDict.actor_rollout_generate_sequences``), its
    ``phase``, ``frame`` (the deepest frame, ``file:line in function``), ``verl_frame`` (the
    deepest frame in verl's own code), ``code`` (the deepest frame's source line) and
    ``frames`` (the root cause's last frames, deepest last); only the ones the lines give."""
    out: dict[str, Any] = {}
    deepest = verl = code = None
    frames: list[str] = []
    for line in lines:
        if "RayTaskError(" in line:
            match = _RAY_TASK_LINE_RE.search(line)
            if match is not None:
                out["task"] = match.group(2)
                deepest = verl = code = None  # the worker's own frames follow
                frames = []
            continue
        if 'File "' in line:
            match = _FRAME_RE.search(line)
            if match is not None:
                path, number, fn = match.groups()
                deepest = f"{short_path(path)}:{number} in {fn}"
                frames.append(deepest)
                code = None
                if _is_verl(path):
                    verl = deepest
            continue
        if deepest is not None and code is None and line[:1].isspace() and line.strip() \
                and not _CARETS_ONLY_RE.fullmatch(line.strip()):
            code = line.strip()[:SOURCE_CHARS]
    if "task" in out:
        phase = function_phase(out["task"].rsplit(".", 1)[-1])
        if phase is not None:
            out["phase"] = phase
    if deepest is not None:
        out["frame"] = deepest
        out["frames"] = frames[-MAX_FRAMES:]
    if code is not None:
        out["code"] = code
    if verl is not None and verl != deepest:
        out["verl_frame"] = verl
    return out
