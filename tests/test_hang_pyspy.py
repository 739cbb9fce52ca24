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
