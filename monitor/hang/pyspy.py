"""The fallback without Flight Recorder: py-spy's stack of each GPU process, and who waits.

``py-spy dump --pid PID`` (PyPI ``py-spy``; needs ptrace rights over the process: root, the
same user with ``kernel.yama.ptrace_scope`` 0, or ``CAP_SYS_PTRACE`` in a container) prints
each thread's stack, innermost first::

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
import subprocess
import sys
from collections.abc import Mapping
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


def find_pyspy() -> str | None:
    """py-spy's path: on PATH, else beside this Python (a venv's bin)."""
    exe = shutil.which("py-spy")
    if exe:
        return exe
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else None


def dump_text(pid: int, timeout_s: float = 20.0, exe: str | None = None) -> tuple[str, str]:
    """``py-spy dump --pid PID`` (every thread): (its text, '') or ('', why not, in words)."""
    exe = exe or find_pyspy()
    if not exe:
        return "", "py-spy is not installed (pip install 'verl-monitor[hang]')"
    try:
        r = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return "", f"py-spy took over {timeout_s:g} s"
    except OSError as exc:
        return "", f"py-spy could not run: {exc.strerror or exc}"
    if r.returncode != 0:
        err = (r.stderr or r.stdout).strip().splitlines()
        why = err[-1] if err else f"exit {r.returncode}"
        if "ermission" in why or "ptrace" in why.lower():
            why += " (py-spy needs ptrace rights: run the exporter as root or with CAP_SYS_PTRACE)"
        return "", why[:300]
    return r.stdout, ""


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
