"""Real py-spy on real stand-in processes: the job's processes are found from the log's Ray
prefixes and titles, stacked, judged, saved and read back (monitor/hang/stacks.py, procs.py),
and the exporter's collector publishes the verdict."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from hang_standins import (
    job_argv,
    start_job,
    start_tree,
    start_worker,
    stop,
    stop_tree,
    write_job_tree,
)

from monitor.hang.procs import job_process_tree, log_pids
from monitor.hang.pyspy import find_pyspy
from monitor.hang.stacks import read_stacks_dir, stack_round

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed")]


def _wait_steps(log, pid: int, n: int) -> None:
    deadline = time.monotonic() + 20
    while log.read_text().count(f"(TaskRunner pid={pid}) step:") < n:
        assert time.monotonic() < deadline, "the stand-in never logged its steps"
        time.sleep(0.05)
    time.sleep(0.5)  # past the last step: stuck now


def _jobs(log) -> list:
    """The stand-ins this test started, proven the job's as ``--hang-job-pid`` proves them
    (this test process as the job's root; the monitor, ``me``, is none of them)."""
    return list(job_process_tree([str(log)], job_pid=os.getpid(), me=-1).procs)


def _round(tmp_path, case: str, url: str = "", worker: bool | None = None):
    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    procs = [start_job(root, case, log, steps=2, step_s=0.1, url=url)]
    if worker is not None:
        procs.append(start_worker(root, log, busy=worker,
                                  title="ray::WorkerDict.actor_rollout_generate_sequences"
                                  if worker else "ray::WorkerDict"))
    try:
        _wait_steps(log, procs[0].pid, 2)
        ours = {q.pid for q in procs}
        found = [p for p in _jobs(log)
                 if p.pid in ours or p.source == "child"]
        got = stack_round(found, node="n0", save_dir=tmp_path / "stacks")
    finally:
        stop(procs)
    if any("ptrace" in v for v in got.problems.values()):
        pytest.skip(str(got.problems))
    return procs, found, got, tmp_path / "stacks"


def test_the_driver_stuck_in_compute_score_is_found_from_the_log_and_named(tmp_path):
    procs, found, got, saved = _round(tmp_path, "reward", worker=False)
    assert {(p.pid, p.role) for p in found} == {(procs[0].pid, "driver"),
                                               (procs[1].pid, "worker")}
    v = got.verdict
    assert v.stuck and v.place == "reward" and v.who[0].pid == procs[0].pid
    assert str(v.who[0].frame).startswith("normalize_final_answer (user_reward.py:")
    assert "No rank waits in a collective" in v.summary()
    ev = got.to_event(time.time(), "n0")
    assert ev.data["where"]["place"] == "reward" and ev.data["culprits"][0]["pid"] == \
        procs[0].pid
    rounds = read_stacks_dir(saved)  # the saved dumps judge the same offline
    assert len(rounds) == 1 and {w.place for w in rounds[0][1]} == {"reward", "ray_idle"}


def test_a_reward_blocked_on_an_http_server_that_never_answers(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    try:
        _, _, got, _ = _round(tmp_path, "http", url=f"http://127.0.0.1:{srv.getsockname()[1]}/")
    finally:
        srv.close()
    w = got.verdict.who[0]
    assert got.verdict.place == "reward" and "HTTP answer" in w.detail
    assert w.frame.name == "compute_score"


def test_a_blocked_data_loader_and_a_worker_method_that_never_returns(tmp_path):
    _, _, data, _ = _round(tmp_path / "a", "data")
    assert data.verdict.place == "dataloader"
    assert data.verdict.who[0].frame.name == "BlockingDataset.__getitem__"
    procs, _, held, _ = _round(tmp_path / "b", "worker", worker=True)
    assert held.verdict.place == "method" and held.verdict.who[0].pid == procs[1].pid
    assert held.verdict.who[0].frame.filename == "verl/workers/fsdp_workers.py"


def test_prefixes_on_another_host_are_not_this_nodes():
    text = "(TaskRunner pid=11) a\n(WorkerDict pid=12, ip=10.9.9.9) b\n(WorkerDict pid=13, ip=127.0.0.1) c"
    assert log_pids(text) == {11: ("TaskRunner", ""), 12: ("WorkerDict", "10.9.9.9"),
                              13: ("WorkerDict", "127.0.0.1")}
    assert 12 not in job_process_tree([]).pids


def test_another_jobs_processes_with_the_same_ray_titles_are_left_out(tmp_path):
    """Two jobs, each under its own raylet: the log names one; the other's actors, with the
    same titles, are not this job's (nor is anything found by title alone)."""
    root = write_job_tree(tmp_path / "job")
    mine, other = tmp_path / "mine.log", tmp_path / "other.log"
    mine.write_text("")
    other.write_text("")
    raylet = str(tmp_path / "ray/core/src/ray/raylet/raylet")
    trees = [start_tree([job_argv(root, "reward", log, steps=1, step_s=0.1)], argv0=raylet)
             for log in (mine, other)]
    try:
        _wait_steps(mine, trees[0][1][0], 1)
        pids = job_process_tree([str(mine)], me=-1).pids
        alone = job_process_tree([], me=-1).pids  # no log: no title proves anything
    finally:
        for parent, kids in trees:
            stop_tree(parent, kids)
    assert trees[0][1][0] in pids and trees[1][1][0] not in pids
    assert alone == frozenset()


def test_a_data_loader_worker_forked_from_the_driver_is_found_and_named(tmp_path):
    """As in real verl: the loader's worker is a fork of the TaskRunner (same Ray title, not in
    the log); it is found as the driver's child and named as the one blocked in the dataset."""
    procs, found, got, _ = _round(tmp_path, "data_mp")
    child = [p for p in found if p.source == "child"]
    assert len(child) == 1
    v = got.verdict
    assert v.stuck and v.place == "dataloader" and v.phase == "data_wait"
    assert (v.who[0].role, v.who[0].pid) == ("data loader worker", child[0].pid)
    assert str(v.who[0].frame).startswith("BlockingDataset.__getitem__ (user_dataset.py:")
    assert v.who[-1].pid == procs[0].pid  # the driver, waiting for it


def test_saved_dumps_of_the_monitors_own_exporter_are_not_read_as_the_jobs_processes():
    """Dumps saved on the H200 by an exporter that still stacked its neighbours' exporters
    (real py-spy files): read again, no place comes from a ``python -m monitor exporter``."""
    folder = Path(__file__).parent / "fixtures" / "real_verl" / "hang_reward_live" / "stacks_live"
    monitor_pids = {int(p.stem.rsplit("_", 1)[1]) for p in folder.glob("*.txt")
                    if " -m monitor exporter " in p.read_text(errors="replace")[:400]}
    assert monitor_pids  # the fixture holds such dumps
    places = [w for _, wheres in read_stacks_dir(folder) for w in wheres]
    assert places and not {w.pid for w in places} & monitor_pids
    assert any(w.place == "reward" for w in places)


def test_a_worker_killed_in_the_silence_is_gone_and_named_while_the_driver_waits(tmp_path):
    from monitor.hang.procs import GoneWatch, JobProcess
    from monitor.hang.stacks import gone_wheres

    root = write_job_tree(tmp_path / "job")
    log = tmp_path / "train.log"
    log.write_text("")
    procs = [start_job(root, "worker", log, steps=2, step_s=0.1),
             start_worker(root, log, busy=False, title="ray::WorkerDict")]
    watch = GoneWatch()
    try:
        _wait_steps(log, procs[0].pid, 2)
        last = time.time()
        ours = {q.pid for q in procs}
        watch.see([p for p in _jobs(log) if p.pid in ours], last + 1.0)
        assert watch.check(last + 1.2) == []  # both alive
        procs[1].kill()
        procs[1].wait()  # reaped, as Ray's raylet reaps its workers
        gone = watch.check(last + 2.0)
        assert [g.proc.pid for g in gone] == [procs[1].pid] and gone[0].proc.role == "worker"
        assert watch.gone_since(last) == gone and watch.gone_since(last + 1.3) == []
        found = [p for p in _jobs(log) if p.pid in ours]
        assert [p.pid for p in found] == [procs[0].pid]  # the dead one is not found again
        dead = JobProcess(procs[1].pid, "worker", "log")  # listed, then gone before its dump
        got = stack_round(found, node="n0", gone=gone_wheres(gone, last, "n0"))
        late = stack_round([*found, dead], node="n0", since=last)
    finally:
        stop(procs)
    if any("ptrace" in v for v in got.problems.values()):
        pytest.skip(str(got.problems))
    v = got.verdict
    assert v.stuck and v.place == "gone" and [w.pid for w in v.who] == [procs[1].pid]
    assert v.summary().startswith(f"the worker (PID {procs[1].pid}, node n0) is gone: it "
                                  "exited 1 s after the last step (killed or crashed)")
    assert "the driver" in v.summary() and "waits on a worker-group call" in v.summary()
    ev = got.to_event(time.time(), "n0")
    assert ev.data["where"]["place"] == "gone" and ev.data["culprits"][0]["pid"] == \
        procs[1].pid
    assert late.verdict.place == "gone" and late.gone[0].pid == procs[1].pid
    assert f"py-spy PID {procs[1].pid}" not in late.problems  # gone, not a failed dump
