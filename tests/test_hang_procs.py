"""Which processes are the job's (monitor/hang/procs.py), on real processes: never the monitor
itself (on the H200 the exporters of five side-by-side runs, holding the GPU through NVML, were
dumped as the job's "workers" at ``wait_for_signal (cli/commands/exporter.py:293)``), and never
another job's GPU holders once the log has named this job's own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hang_standins import start_job, start_worker, stop, write_job_tree

from monitor.hang.procs import find_job_processes, is_monitor

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
#: A parent that starts its argv (argv[1] the title, the rest its arguments) under itself and
#: prints the child's pid: another job's process, with its own parent (its own raylet).
UNDER_OWN_PARENT = ("import subprocess, sys, time\n"
                    "p = subprocess.Popen(sys.argv[1:], executable=sys.executable)\n"
                    "print(p.pid, flush=True)\n"
                    "p.wait()\n")


def _kill(*pids: int) -> None:
    """End the grandchildren this test started, by pid."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_steps(log: Path, pid: int) -> None:
    deadline = time.monotonic() + 20
    while f"(TaskRunner pid={pid}) step:" not in log.read_text():
        assert time.monotonic() < deadline, "the stand-in never logged a step"
        time.sleep(0.05)


def _exporter(tmp_path: Path) -> subprocess.Popen:
    """The real exporter, started as verl-monitor run starts it on the H200."""
    return subprocess.Popen([sys.executable, "-m", "monitor", "exporter", "--listen-address",
                             "127.0.0.1:0", "--gpu-backend", "sim", "--interval", "5",
                             "--store", str(tmp_path / "store.db")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _sleeper(argv0: str, *args: str) -> subprocess.Popen:
    """A real process whose command line reads ``argv0 args...``."""
    return subprocess.Popen([argv0, "-c", "import time; time.sleep(60)", *args],
                            executable=sys.executable)


def _other_jobs(root: Path, log: Path) -> tuple[list[subprocess.Popen], list[int]]:
    """Another job's WorkerDict and launcher, each under a parent of its own."""
    procs, pids = [], []
    for argv in (["ray::WorkerDict", str(root / "ray/_private/workers/default_worker.py"),
                  str(log), "idle"],
                 ["python3", "-c", "import time; time.sleep(60)", "-m", "verl.trainer.main_ppo"]):
        p = subprocess.Popen([sys.executable, "-c", UNDER_OWN_PARENT, *argv],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        line = p.stdout.readline()
        while not line.strip().isdigit():  # the child's own "ready" may come first
            line = p.stdout.readline()
        pids.append(int(line))
        procs.append(p)
    return procs, pids


def test_the_monitors_own_command_lines_are_told_apart_from_a_jobs():
    assert is_monitor("/opt/torch/.venv/bin/python3 -m monitor exporter --listen-address "
                      "127.0.0.1:0 --node h200 --log /tmp/x/train.log --hang-pyspy")
    assert is_monitor("/work/.venv/bin/verl-monitor run --exporter-args --store a.db -- python3 "
                      "-m verl.trainer.main_ppo")
    assert is_monitor("python -m monitor.cli analyze train.log")
    assert not is_monitor("/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo "
                          "trainer.project_name=verl-monitor-test")
    assert not is_monitor("/opt/torch/.venv/bin/python3 -u /tmp/site/ray/autoscaler/_private/"
                          "monitor.py --logs-dir=/tmp/ray")
    assert not is_monitor("ray::TaskRunner.run")


def test_the_exporter_and_verl_monitor_run_holding_the_gpu_are_not_the_jobs_workers(tmp_path):
    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    procs = [start_job(root, "reward", log, steps=1, step_s=0.1), _exporter(tmp_path),
             _sleeper(str(VENV_BIN / "verl-monitor"), "run", "--", "python3", "train.py")]
    try:
        _wait_steps(log, procs[0].pid)
        holders = {p.pid for p in procs}  # NVML opens /dev/nvidia* in the exporter
        found = {p.pid: p for p in find_job_processes([str(log)], gpu_pids=holders)}
        alone = {p.pid for p in find_job_processes([], gpu_pids=holders)}  # no log, no tree
        assert all(p.poll() is None for p in procs)  # all alive when looked at
    finally:
        stop(procs)
    assert set(found) == {procs[0].pid} and found[procs[0].pid].role == "driver"
    assert procs[1].pid not in alone and procs[2].pid not in alone


def test_the_run_and_its_exporter_are_left_out_of_the_runs_tree(tmp_path):
    """``verl-monitor run`` (the parent) starts the exporter and the job: the job's launcher is
    its driver, the exporter beside it is nobody's."""
    tree = ("import subprocess, sys, time\n"
            "py, store = sys.argv[1:3]\n"
            "a = subprocess.Popen([py, '-m', 'monitor', 'exporter', '--listen-address',"
            " '127.0.0.1:0', '--gpu-backend', 'sim', '--interval', '5', '--store', store],"
            " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "b = subprocess.Popen(['python3', '-c', 'import time; time.sleep(60)'],"
            " executable=py)\n"
            "print(a.pid, b.pid, flush=True)\n"
            "time.sleep(60)\n")
    run = subprocess.Popen([str(VENV_BIN / "verl-monitor"), "-c", tree, sys.executable,
                            str(tmp_path / "s.db"),
                            "run", "--", "python3", "train.py"], executable=sys.executable,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        exporter, job = (int(x) for x in run.stdout.readline().split())
        found = {p.pid: p for p in find_job_processes([], parent=run.pid,
                                                      gpu_pids={exporter, job})}
        assert psutil.pid_exists(exporter) and psutil.pid_exists(job)
    finally:
        _kill(exporter, job)
        stop([run])
    assert set(found) == {job}, found
    assert found[job].role == "driver" and found[job].source == "tree"


def test_another_jobs_gpu_holders_are_left_out_once_the_log_names_this_jobs_own(tmp_path):
    """Five runs side by side on one H200: each exporter dumped the other jobs' WorkerDicts and
    launchers (they hold the GPU). This job's own quiet worker, a sibling under the same
    raylet, still counts."""
    root = write_job_tree(tmp_path / "job")
    log, other_log = tmp_path / "train.log", tmp_path / "other.log"
    log.write_text("")
    other_log.write_text("")
    mine = [start_job(root, "reward", log, steps=1, step_s=0.1),
            start_worker(root, tmp_path / "quiet.log", busy=False)]  # never in train.log
    others, other_pids = _other_jobs(root, other_log)
    try:
        _wait_steps(log, mine[0].pid)
        holders = {mine[1].pid, *other_pids}
        found = {p.pid for p in find_job_processes([str(log)], gpu_pids=holders)}
        alone = {p.pid for p in find_job_processes([], gpu_pids=holders)}
    finally:
        _kill(*other_pids)
        stop(mine + others)
    assert found == {mine[0].pid, mine[1].pid}, found
    assert set(other_pids) <= alone  # with nothing to go by, every GPU holder counts


def test_only_the_jobs_lasting_processes_are_watched_and_each_gone_one_keeps_its_gpu_and_rank():
    from monitor.hang.procs import GoneWatch, JobProcess

    running = {1, 2, 3}
    watch = GoneWatch(is_alive=lambda pid: pid in running)
    watch.see([JobProcess(1, "driver", "log"), JobProcess(2, "data loader worker", "child"),
               JobProcess(3, "worker", "gpu")], 10.0, gpus={3: 1}, ranks={3: 1})
    assert watch.check(11.0) == []
    running -= {2, 3}  # a loader's worker ends by itself; the rank on GPU 1 is killed
    gone = watch.check(12.0)
    assert [(g.proc.pid, g.gpu, g.rank, g.last_alive, g.gone_at) for g in gone] == [
        (3, 1, 1, 11.0, 12.0)]
    assert watch.check(13.0) == [] and watch.gone_since(11.0) == gone
    running.add(3)  # the PID seen again (reused): alive, no longer gone
    watch.see([JobProcess(3, "worker", "gpu")], 14.0)
    assert watch.gone_since(0.0) == []
