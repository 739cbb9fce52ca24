"""monitor/hang/pyspy.py: py-spy's real output, parsed and compared; a real py-spy run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from hang_standins import FIXTURES

from monitor.hang.pyspy import Stack, dump_stack, localize_stacks, parse_dump_text


def test_the_h200_stack_stuck_in_synchronize_waits_and_the_running_one_does_not():
    stuck = parse_dump_text(1, (FIXTURES / "stuck_kernel" / "pyspy.txt").read_text())
    running = parse_dump_text(2, (FIXTURES / "running" / "pyspy.txt").read_text())
    assert stuck.waiting and stuck.frames[0].name == "synchronize"
    assert not running.waiting and running.top_user_frame.name == "_child"


def test_the_process_not_waiting_is_named_and_the_waiting_ones_are_not():
    stuck = parse_dump_text(10, (FIXTURES / "stuck_kernel" / "pyspy.txt").read_text())
    running = parse_dump_text(11, (FIXTURES / "running" / "pyspy.txt").read_text())
    loc = localize_stacks({10: stuck, 11: running})
    assert [(c.rank, c.pid) for c in loc.culprits] == [(-1, 11)]  # no rank known: the PID
    assert loc.culprits[0].frame.name == "_child" and list(loc.waiting) == [10]
    assert loc.summary().startswith("a process (PID 11): is not in a collective")
    assert loc.method == "py-spy"


def test_nothing_readable_says_why():
    loc = localize_stacks({5: Stack(5, (), "py-spy is not installed (pip install py-spy)")})
    assert loc.culprits == [] and "not installed" in loc.summary()


def test_a_missing_py_spy_is_an_error_in_words():
    st = dump_stack(1, exe="/nonexistent/py-spy")
    assert st.frames == () and "could not run" in st.error


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("py-spy") is None and not shutil.os.path.exists(
    sys.prefix + "/bin/py-spy"), reason="py-spy not installed")
def test_a_real_py_spy_dump_of_a_sleeping_process():
    exe = shutil.which("py-spy") or sys.prefix + "/bin/py-spy"
    code = "import time\ndef load_batch():\n    time.sleep(60)\nload_batch()\n"
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        st = dump_stack(p.pid, exe=exe)
    finally:
        p.kill()
        p.wait()
    if st.error and "ptrace" in st.error:
        pytest.skip(st.error)  # a container without ptrace rights: the words are the result
    assert st.frames[0].name == "load_batch" and not st.waiting


def _fake_pyspy(tmp_path, body: str):
    """A stand-in ``py-spy`` (a shell script) that writes its PID to ``pids`` first."""
    exe = tmp_path / "py-spy"
    exe.write_text(f"#!/bin/sh\necho $$ >> {tmp_path / 'pids'}\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def _pids(tmp_path) -> list[int]:
    path = tmp_path / "pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.slow
def test_a_round_of_13_hung_py_spies_takes_one_deadline_and_leaves_none_running(tmp_path):
    from monitor.hang.pyspy import dump_many

    exe = _fake_pyspy(tmp_path, "exec sleep 3600")
    t0 = time.monotonic()
    got = dump_many(range(100, 113), timeout_s=1.0, exe=exe, parallel=16)
    took = time.monotonic() - t0
    assert took < 6.0, took  # in parallel: one deadline, not 13 (it took 130 s one by one)
    assert set(got) == set(range(100, 113))
    assert all(why == "py-spy took over 1 s" for _, why in got.values())
    assert len(_pids(tmp_path)) == 13 and not any(_alive(p) for p in _pids(tmp_path))


@pytest.mark.slow
def test_no_py_spy_outlives_an_exporter_killed_while_it_waits(tmp_path):
    """py-spy gets SIGKILL from the kernel when the thread that started it ends, ``kill -9``
    of the exporter included (a py-spy left attached would keep its target under ptrace)."""
    exe = _fake_pyspy(tmp_path, "exec sleep 3600")
    code = ("import sys; from monitor.hang.pyspy import dump_many; "
            f"dump_many([1], timeout_s=600, exe={exe!r})")
    exporter = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while not _pids(tmp_path):
            assert time.monotonic() < deadline, "the py-spy stand-in never started"
            time.sleep(0.05)
        spy = _pids(tmp_path)[0]
        assert _alive(spy)
    finally:
        exporter.kill()
        exporter.wait()
    deadline = time.monotonic() + 10
    while _alive(spy):
        assert time.monotonic() < deadline, "py-spy outlived the exporter"
        time.sleep(0.05)


def test_a_refusal_for_ptrace_says_how_to_fix_it(tmp_path):
    from monitor.hang.pyspy import dump_many

    exe = _fake_pyspy(tmp_path, "echo 'Error: Permission denied (os error 13)' >&2; exit 1")
    _, why = dump_many([1], timeout_s=10.0, exe=exe)[1]
    assert why.startswith("Error: Permission denied (os error 13) (py-spy needs ptrace rights")
    assert "--cap-add SYS_PTRACE" in why and "kernel.yama.ptrace_scope=0" in why


def test_where_py_spy_may_not_attach_the_words_name_the_setting_and_the_fix():
    from monitor.hang.pyspy import ptrace_problem

    assert ptrace_problem(0, scope=1, cap=True, my_uid=0) is None  # root with the capability
    assert ptrace_problem(1000, scope=0, cap=False, my_uid=1000) is None  # the job's own user
    one = ptrace_problem(1000, scope=1, cap=False, my_uid=1000)
    assert "kernel.yama.ptrace_scope is 1" in one and "--cap-add SYS_PTRACE" in one
    assert "sysctl kernel.yama.ptrace_scope=0" in one
    two = ptrace_problem(1000, scope=2, cap=False, my_uid=0)
    assert "ptrace_scope is 2" in two and "--cap-add SYS_PTRACE" in two
    other = ptrace_problem(1000, scope=0, cap=False, my_uid=1001)
    assert "the job runs as uid 1000 and this exporter as uid 1001" in other
    assert "ptrace_scope is 3" in ptrace_problem(0, scope=3, cap=True, my_uid=0)
