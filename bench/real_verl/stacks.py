"""Python stacks of a running verl job, every few seconds, with py-spy (every thread).

The job's processes are found by Ray's process titles: ``ray::TaskRunner...`` (the driver, which
scores rewards; its forked DataLoader workers carry the same title, so a TaskRunner whose parent
is a TaskRunner is a ``DataLoaderWorker``), ``ray::WorkerDict...`` (the GPU worker), and the
launching ``verl.trainer.main_ppo`` process (``Launcher``). Each dump is saved as
``<dir>/<unix_ts>_<role>_<pid>.txt``; its first line is ``# <unix ts> <role> pid=<pid>
title=<process title>``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil


def job_processes(root: int | None = None) -> dict[int, tuple[str, str]]:
    """pid -> (role, title) of the verl job's processes on this machine; with ``root``, only
    that process's descendants (Ray's raylet, and so its workers, are children of the driver
    that called ``ray.init``), so that jobs running side by side are told apart."""
    found: dict[int, tuple[str, str]] = {}
    titles: dict[int, str] = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if cmd:
            titles[p.info["pid"]] = " ".join(cmd)
    procs = psutil.process_iter(["pid", "ppid"])
    if root is not None:
        try:
            procs = [p for p in psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            return found
    for p in procs:
        try:
            pid, ppid = p.pid, p.ppid()
        except psutil.Error:
            continue
        title = titles.get(pid, "")
        if title.startswith("ray::TaskRunner"):
            parent = titles.get(ppid or 0, "")
            role = "DataLoaderWorker" if parent.startswith("ray::TaskRunner") else "TaskRunner"
        elif title.startswith("ray::WorkerDict"):
            role = "WorkerDict"
        elif "verl.trainer.main_ppo" in title and not title.startswith("ray::") \
                and "monitor" not in title.split(" -- ")[0]:
            role = "Launcher"
        else:
            continue
        found[pid] = (role, title[:200].strip())
    return found


def dump(pyspy: str, pid: int, role: str, title: str, folder: Path) -> Path | None:
    """One py-spy dump of every thread of ``pid`` into ``folder``; None when it failed."""
    ts = time.time()
    try:
        r = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=20)
    except (subprocess.TimeoutExpired, OSError) as exc:
        text, ok = f"py-spy failed: {exc}\n", False
    else:
        text, ok = r.stdout + (("\n# stderr: " + r.stderr) if r.stderr.strip() else ""), \
            r.returncode == 0
    path = folder / f"{ts:.3f}_{role}_{pid}.txt"
    path.write_text(f"# {ts:.3f} {role} pid={pid} title={title}\n{text}")
    return path if ok else None


class StackSampler(threading.Thread):
    """Dumps the job's stacks every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, pyspy: str, folder: Path, interval: float = 10.0,
                 root: int | None = None):
        super().__init__(daemon=True, name="stack-sampler")
        self.pyspy, self.folder, self.interval, self.root = pyspy, folder, interval, root
        self.folder.mkdir(parents=True, exist_ok=True)
        self._halt = threading.Event()
        self.dumps = 0
        self.failed = 0

    def run(self) -> None:
        while not self._halt.is_set():
            start = time.monotonic()
            for pid, (role, title) in sorted(job_processes(self.root).items()):
                if self._halt.is_set():
                    break
                if dump(self.pyspy, pid, role, title, self.folder) is None:
                    self.failed += 1
                else:
                    self.dumps += 1
            self._halt.wait(max(0.5, self.interval - (time.monotonic() - start)))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
