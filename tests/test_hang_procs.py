"""Which processes are the job's (monitor/hang/procs.py), on real processes: only those proven
so (under ``verl-monitor run``'s job, ``--hang-job-pid`` or the job's own raylet, as the job's
user). A PID printed in the log, a Ray title or a GPU holder is a hint that must pass that proof
(issue 41: another user's ``ray::WorkerDict``, named by one printed line or found by its title,
was py-spied as the job's worker); the monitor knows itself by its PID, so a job started as
``python3 -m pkg.cli.main`` is the job's (it was taken for the monitor)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from hang_standins import (
    OTHER_USERS_PYTHON,
    SLEEP,
    job_argv,
    start_tree,
    stop,
    stop_tree,
    worker_argv,
    write_job_tree,
)

from monitor.hang.procs import RUN_PID_ENV, is_monitor, job_process_tree, run_parent

VENV_BIN = Path(sys.executable).parent
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or not os.access(OTHER_USERS_PYTHON, os.X_OK),
                               reason="needs root and a system Python to start another user's "
                               "process")
NOBODY = 65534


def _wait_steps(log: Path, n: int = 1) -> int:
    """The driver stand-in's PID, once it logged ``n`` steps."""
    deadline = time.monotonic() + 20
    while True:
        text = log.read_text()
        if text.count(" step:") >= n:
            return int(text.split("(TaskRunner pid=", 1)[1].split(")", 1)[0])
        assert time.monotonic() < deadline, "the stand-in never logged a step"
        time.sleep(0.05)


def _sleeper(title: str = "python3"):
    import subprocess

    return subprocess.Popen([title, *SLEEP], executable=sys.executable)


def test_the_monitors_own_command_lines_are_told_apart_from_a_jobs():
    assert is_monitor("/opt/torch/.venv/bin/python3 -m monitor exporter --listen-address "
                      "127.0.0.1:0 --node h200 --log /tmp/x/train.log --hang-pyspy")
    assert is_monitor("/work/.venv/bin/verl-monitor run --exporter-args --store a.db -- python3 "
                      "-m verl.trainer.main_ppo")
    assert is_monitor("python -m monitor.cli analyze train.log")
    assert not is_monitor("python3 -m jobpkg.cli.main j.log 5")  # a job's own cli.main
    assert not is_monitor("/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo "
                          "trainer.project_name=verl-monitor-test")
    assert not is_monitor("ray::TaskRunner.run")


def test_the_run_is_proven_by_the_variable_it_sets_and_being_the_parent():
    assert run_parent({RUN_PID_ENV: "4242"}, ppid=4242) == 4242
    assert run_parent({RUN_PID_ENV: "4242"}, ppid=4243) is None  # not (or no longer) our parent
    assert run_parent({}, ppid=4242) is None
    assert run_parent({RUN_PID_ENV: "1"}, ppid=1) is None  # orphaned: init is nobody's run


@pytest.mark.slow
def test_under_run_the_jobs_tree_is_the_job_even_as_python_m_pkg_cli_main(tmp_path):
    """``verl-monitor run`` starts the exporter and the job; the job is its other child and
    what it starts, the exporter (``me``) is not."""
    pkg = tmp_path / "jobpkg" / "cli"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "jobpkg", pkg):
        (d / "__init__.py").touch()
    (pkg / "main.py").write_text("import time\ndef reward_fn():\n    time.sleep(120)\n"
                                 "reward_fn()\n")
    run, (exporter, job) = start_tree(
        [["python3", "-m", "monitor", "exporter", *SLEEP],
         ["python3", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
          "import runpy; runpy.run_module('jobpkg.cli.main', run_name='__main__')",
          "-m", "jobpkg.cli.main"]],
        argv0=str(VENV_BIN / "verl-monitor"))
    try:
        tree = job_process_tree([], run_pid=run.pid, me=exporter)
    finally:
        stop_tree(run, [exporter, job])
    assert [(p.pid, p.role, p.source) for p in tree.procs] == [(job, "driver", "tree")]
    assert "under the job `verl-monitor run` started" in tree.proof and tree.why == ""


@pytest.mark.slow
def test_the_actors_of_the_raylet_the_log_names_are_the_jobs_not_its_idle_workers_or_daemons(
        tmp_path):
    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    raylet, pids = start_tree(
        [job_argv(root, "reward", log, steps=1, step_s=0.1),
         worker_argv(root, tmp_path / "quiet.log"),  # never in train.log
         ["ray::IDLE", *SLEEP],
         ["python3", "/x/ray/dashboard/agent.py", *SLEEP]],
        argv0=str(tmp_path / "ray/core/src/ray/raylet/raylet"))
    me = _sleeper()
    try:
        driver = _wait_steps(log)
        tree = job_process_tree([str(log)], me=me.pid)
    finally:
        stop_tree(raylet, pids)
        stop([me])
    assert driver == pids[0]
    found = {p.pid: (p.role, p.source) for p in tree.procs}
    assert found == {pids[0]: ("driver", "log"), pids[1]: ("worker", "ray")}, found
    assert f"under the job's raylet (PID {raylet.pid}" in tree.proof


@pytest.mark.slow
@ROOT_ONLY
def test_a_log_line_naming_another_users_ray_process_or_one_outside_a_raylet_proves_nothing(
        tmp_path):
    """The attacks of issue 41 (N2, N3): a ``nobody``-owned ``ray::WorkerDict`` in a session of
    its own, named by a printed line; this job's driver stand-in outside any raylet."""
    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    other, (victim,) = start_tree([["ray::WorkerDict", *SLEEP]], user=NOBODY)
    mine, (driver,) = start_tree([job_argv(root, "reward", log, steps=1, step_s=0.1)])
    me = _sleeper()
    try:
        _wait_steps(log)
        with open(log, "a") as fh:
            fh.write(f"(WorkerDict pid={victim}) INFO worker ready\n")
        tree = job_process_tree([str(log)], me=me.pid)
    finally:
        stop_tree(other, [victim])
        stop_tree(mine, [driver])
        stop([me])
    assert tree.procs == ()
    assert f"PID {victim} runs as uid {NOBODY}, not as the log's owner (uid 0)" in tree.why
    assert f"PID {driver} runs under no Ray raylet" in tree.why
    assert tree.why.startswith("no process of the job is proven on this node, so no stacks "
                               "are taken")


@pytest.mark.slow
@ROOT_ONLY
def test_another_users_raylet_and_its_actors_are_not_the_jobs_of_a_log_we_own(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    raylet, pids = start_tree([["ray::TaskRunner.run", *SLEEP]],
                              argv0=str(tmp_path / "ray/core/src/ray/raylet/raylet"),
                              user=NOBODY)
    me = _sleeper()
    try:
        with open(log, "a") as fh:  # as if its job printed into our log
            fh.write(f"(TaskRunner pid={pids[0]}) step:1 - timing_s/step:1.0\n")
        tree = job_process_tree([str(log)], me=me.pid)
    finally:
        stop_tree(raylet, pids)
        stop([me])
    assert tree.procs == () and f"PID {pids[0]} runs as uid {NOBODY}" in tree.why


def test_without_a_run_a_job_pid_or_a_log_nothing_is_proven_and_the_words_say_why():
    tree = job_process_tree([], me=os.getpid())
    assert tree.procs == () and tree.pids == frozenset()
    assert tree.why == ("no process of the job is proven on this node, so no stacks are taken: "
                        "the exporter was not started by `verl-monitor run` nor inside the "
                        "job's Ray cluster, no --hang-job-pid was given, and no log is "
                        "followed")


@pytest.mark.slow
def test_a_job_pid_given_is_the_jobs_root(tmp_path):
    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    launcher, (driver, worker) = start_tree(
        [job_argv(root, "reward", log, steps=1, step_s=0.1),
         worker_argv(root, log, "idle")])
    me = _sleeper()
    try:
        _wait_steps(log)
        tree = job_process_tree([str(log)], job_pid=launcher.pid, me=me.pid)
    finally:
        stop_tree(launcher, [driver, worker])
        stop([me])
    found = {p.pid: (p.role, p.source) for p in tree.procs}
    assert found == {driver: ("driver", "log"), worker: ("worker", "log")}, found


def test_only_the_jobs_lasting_processes_are_watched_and_each_gone_one_keeps_its_gpu_and_rank():
    from monitor.hang.procs import GoneWatch, JobProcess

    running = {1, 2, 3}
    watch = GoneWatch(is_alive=lambda pid: pid in running)
    watch.see([JobProcess(1, "driver", "log"), JobProcess(2, "data loader worker", "child"),
               JobProcess(3, "worker", "ray")], 10.0, gpus={3: 1}, ranks={3: 1})
    assert watch.check(11.0) == []
    running -= {2, 3}  # a loader's worker ends by itself; the rank on GPU 1 is killed
    gone = watch.check(12.0)
    assert [(g.proc.pid, g.gpu, g.rank, g.last_alive, g.gone_at) for g in gone] == [
        (3, 1, 1, 11.0, 12.0)]
    assert watch.check(13.0) == [] and watch.gone_since(11.0) == gone
    running.add(3)  # the PID seen again (reused): alive, no longer gone
    watch.see([JobProcess(3, "worker", "ray")], 14.0)
    assert watch.gone_since(0.0) == []
