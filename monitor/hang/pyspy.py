"""The fallback without Flight Recorder: py-spy's stack of each GPU process, and who waits.

``py-spy dump --pid PID`` (PyPI ``py-spy``, in the core install; needs ptrace rights over the
process: root, the same user with ``kernel.yama.ptrace_scope`` 0, or ``CAP_SYS_PTRACE`` in a
container: :func:`ptrace_problem` says which is missing) prints each thread's stack, innermost
first (:func:`dump_many` runs several at once, within one deadline)::

    Thread 657 (active): "MainThread"
        synchronize (torch/cuda/__init__.py:1162)
        _child (flight_recorder.py:66)

A process whose main thread sits in a collective or a CUDA synchronisation waits; one that
does not (it sleeps, loads data, computes on the CPU) is what the waiting ones wait for.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from monitor.hang.dump import Frame
from monitor.hang.localize import Culprit, Localization, RankInfo

_FRAME = re.compile(r"^\s+(?P<name>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
_THREAD = re.compile(r'^Thread \S+ \((?P<state>[^)]*)\)(?:: "(?P<name>[^"]*)")?')

#: Frames that mean "waiting for the others or for the GPU".
_WAIT_NAMES = re.compile(
    r"^(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|"
    r"all_to_all\w*|reduce|gather|scatter|send|recv|isend|irecv|wait|synchronize|"
    r"_allgather_base|_reduce_scatter_base|item|tolist|cpu)$")
_WAIT_FILES = ("torch/distributed/", "torch/cuda/", "torch/_tensor", "ray/_private/worker.py")


@dataclass(frozen=True)
class Stack:
    """The main thread's frames of one process (innermost first), or why there are none."""

    pid: int
    frames: tuple[Frame, ...] = ()
    error: str = ""

    @property
    def waiting(self) -> bool:
        """True when the innermost frames are a collective or a wait on the GPU."""
        for fr in self.frames[:4]:
            if _WAIT_NAMES.match(fr.name) and any(p in fr.filename for p in _WAIT_FILES):
                return True
            if fr.name in ("synchronize", "wait") and "cuda" in fr.filename:
                return True
        return False

    @property
    def top_user_frame(self) -> Frame | None:
        """The innermost frame outside torch (where the job's own code is)."""
        for fr in self.frames:
            if "torch/" not in fr.filename:
                return fr
        return self.frames[0] if self.frames else None


def parse_dump_text(pid: int, text: str) -> Stack:
    """The main thread's frames from py-spy's text output."""
    frames: list[Frame] = []
    in_main = False
    seen_thread = False
    for line in text.splitlines():
        t = _THREAD.match(line)
        if t:
            if seen_thread and in_main:
                break
            seen_thread = True
            in_main = t.group("name") == "MainThread" or not frames
            continue
        m = _FRAME.match(line)
        if m and in_main:
            frames.append(Frame(m.group("name"), m.group("file"), int(m.group("line"))))
    if not frames:
        return Stack(pid, (), "py-spy printed no frame")
    return Stack(pid, tuple(frames))


#: The command that installs py-spy (a dependency of the core install since issue 38).
INSTALL_FIX = "pip install py-spy"
#: py-spy dumps run at once at most (the others wait for a free slot, within the deadline).
MAX_PARALLEL = 8
#: ``prctl`` option that has the kernel signal a child when the thread that started it exits.
_PR_SET_PDEATHSIG = 1


def find_pyspy() -> str | None:
    """py-spy's path: on PATH, else beside this Python (a venv's bin)."""
    exe = shutil.which("py-spy")
    if exe:
        return exe
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def has_ptrace_capability(status_path: str = "/proc/self/status") -> bool:
    """True when this process holds CAP_SYS_PTRACE (bit 19 of CapEff)."""
    try:
        with open(status_path) as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 19 & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def ptrace_problem(target_uid: int | None = None, scope: int | None = None,
                   cap: bool | None = None, my_uid: int | None = None) -> str | None:
    """Why py-spy cannot attach to a process of ``target_uid`` here, with the fix, in words
    (None when it can, or when nothing says it cannot). ``scope`` is
    ``kernel.yama.ptrace_scope`` (None: read it; no Yama: 0), ``cap``: CAP_SYS_PTRACE held."""
    scope = _read_int("/proc/sys/kernel/yama/ptrace_scope") if scope is None else scope
    cap = has_ptrace_capability() if cap is None else cap
    me = os.geteuid() if my_uid is None else my_uid
    if scope == 3:
        return ("py-spy cannot attach: kernel.yama.ptrace_scope is 3 (no process may trace "
                "another until reboot); set it lower at boot (sysctl kernel.yama.ptrace_scope=0)")
    if cap:
        return None
    if scope == 2:
        return ("py-spy cannot attach: kernel.yama.ptrace_scope is 2 (only CAP_SYS_PTRACE may "
                "trace) and this exporter lacks CAP_SYS_PTRACE: run it as root with the "
                "capability (in a container: --cap-add SYS_PTRACE)")
    if target_uid is not None and target_uid != me:
        return (f"py-spy cannot attach: the job runs as uid {target_uid} and this exporter as "
                f"uid {me} without CAP_SYS_PTRACE: run the exporter as the job's user, or as "
                "root with the capability (in a container: --cap-add SYS_PTRACE)")
    if scope == 1:
        return ("py-spy cannot attach: kernel.yama.ptrace_scope is 1 (only a parent may trace "
                "its children) and this exporter lacks CAP_SYS_PTRACE: run it with the "
                "capability (in a container: --cap-add SYS_PTRACE), or set sysctl "
                "kernel.yama.ptrace_scope=0")
    return None


def refusal_fix(why: str) -> str:
    """py-spy's own refusal (``Permission denied``, ``Operation not permitted``) with the
    fix appended; other errors unchanged."""
    low = why.lower()
    if "ermission" in why or "not permitted" in low or "ptrace" in low:
        return (why + " (py-spy needs ptrace rights: run the exporter as root with "
                "CAP_SYS_PTRACE, in a container --cap-add SYS_PTRACE, or set sysctl "
                "kernel.yama.ptrace_scope=0 and run it as the job's user)")
    return why


def _die_with_us() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGKILL when the thread that started it ends (the exporter stopped or died)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _load_prctl():
    """libc's prctl, loaded once in the parent (the child must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
#: The py-spy processes running now (so that :func:`stop_all` ends each one).
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def stop_all() -> int:
    """Kill every py-spy still running (the exporter stops); returns how many."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for p in procs:
        _kill(p)
    return len(procs)


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            p.kill()
        except OSError:
            pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    with _RUNNING_LOCK:
        _RUNNING.discard(p)


def _start(exe: str, pid: int, nonblocking: bool) -> subprocess.Popen:
    argv = [exe, "dump", "--pid", str(pid)] + (["--nonblocking"] if nonblocking else [])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL,
                         preexec_fn=_die_with_us if _PRCTL is not None else None)
    with _RUNNING_LOCK:
        _RUNNING.add(p)
    return p


def dump_many(pids: Iterable[int], timeout_s: float = 10.0, exe: str | None = None,
              nonblocking: bool = False, parallel: int = MAX_PARALLEL
              ) -> dict[int, tuple[str, str]]:
    """``py-spy dump --pid PID`` for each PID, ``parallel`` at once, all within ``timeout_s``
    (a py-spy past it is killed): PID -> (its text, '') or ('', why not, in words). Each
    py-spy dies with the thread that started it (``PR_SET_PDEATHSIG``), so none outlives the
    exporter; ``nonblocking``: the process is not paused while it is read (steady readings)."""
    pids = list(dict.fromkeys(pids))
    exe = exe or find_pyspy()
    if not exe:
        why = f"py-spy is not installed ({INSTALL_FIX})"
        return {pid: ("", why) for pid in pids}
    deadline = time.monotonic() + timeout_s
    out: dict[int, tuple[str, str]] = {}
    todo = list(pids)
    running: dict[int, subprocess.Popen] = {}
    try:
        while todo or running:
            while todo and len(running) < max(1, parallel) and time.monotonic() < deadline:
                pid = todo.pop(0)
                try:
                    running[pid] = _start(exe, pid, nonblocking)
                except OSError as exc:
                    out[pid] = ("", f"py-spy could not run: {exc.strerror or exc}")
            if time.monotonic() >= deadline:
                break
            for pid, p in list(running.items()):
                if p.poll() is not None:
                    out[pid] = _result(p)
                    del running[pid]
            if running:
                time.sleep(0.01)
    finally:
        for pid, p in running.items():
            _kill(p)
            out[pid] = ("", f"py-spy took over {timeout_s:g} s")
        for pid in todo:
            out.setdefault(pid, ("", f"py-spy took over {timeout_s:g} s (not started)"))
    return out


def _result(p: subprocess.Popen) -> tuple[str, str]:
    """(text, '') of a finished py-spy, or ('', why not)."""
    try:
        stdout, stderr = p.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        _kill(p)
        return "", "py-spy did not finish writing"
    with _RUNNING_LOCK:
        _RUNNING.discard(p)
    text = stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        err = (stderr.decode("utf-8", "replace") or text).strip().splitlines()
        why = err[-1] if err else f"exit {p.returncode}"
        return "", refusal_fix(why)[:400]
    return text, ""


def dump_text(pid: int, timeout_s: float = 20.0, exe: str | None = None) -> tuple[str, str]:
    """``py-spy dump --pid PID`` (every thread): (its text, '') or ('', why not, in words)."""
    if exe is not None and not os.access(exe, os.X_OK):
        return "", f"py-spy could not run: {exe} is not an executable file"
    return dump_many([pid], timeout_s, exe)[pid]


def dump_stack(pid: int, timeout_s: float = 20.0, exe: str | None = None) -> Stack:
    """Run ``py-spy dump`` on ``pid``; a missing py-spy or a refusal is an error in words."""
    text, why = dump_text(pid, timeout_s, exe)
    return Stack(pid, (), why) if why else parse_dump_text(pid, text)


def localize_stacks(stacks: Mapping[int, Stack], infos: Mapping[int, RankInfo] | None = None
                    ) -> Localization:
    """Name the processes not waiting while others wait (keys: PIDs; a rank is known only when
    ``infos`` maps the key to another PID, i.e. the key is a rank)."""
    infos = infos or {}
    out = Localization(method="py-spy")
    ok = {k: s for k, s in stacks.items() if not s.error}
    waiting = {k for k, s in ok.items() if s.waiting}
    for k in sorted(waiting):
        fr = ok[k].frames[0]
        out.waiting[k] = f"{fr.name} ({fr.filename}:{fr.line})"
    if not ok:
        out.note = "no stack could be read: " + "; ".join(
            f"PID {s.pid}: {s.error}" for s in list(stacks.values())[:3])
        return out
    if not waiting:
        out.note = "no process waits in a collective or on its GPU"
        return out
    for k in sorted(set(ok) - waiting):
        s = ok[k]
        i = infos.get(k, RankInfo(pid=s.pid))
        out.culprits.append(Culprit(
            rank=k if k in infos and infos[k].pid != k else -1,
            reason="is not in a collective while the others wait in one",
            frame=s.top_user_frame, node=i.node, gpu=i.gpu, pid=i.pid or s.pid))
    if not out.culprits:
        out.note = ("every process waits in a collective or on its GPU: a GPU may be stuck in a "
                    "kernel, or the collective itself hangs")
    return out
