"""monitor/hang/request.py against stand-in ranks (real processes answering real FIFOs)."""

from __future__ import annotations

import os

import pytest
from hang_standins import FIXTURES, as_rank, real_dump, start_standin, stop, write_dump

from monitor.hang.request import find_pipes, poke, request_dumps

#: Each test starts stand-in ranks (processes) and waits for their answers.
pytestmark = pytest.mark.slow


def test_each_rank_answers_its_fifo_with_its_dump(tmp_path):
    run = tmp_path / "fr"
    run.mkdir()
    src0 = write_dump(tmp_path / "d0", as_rank(real_dump(), 0, 2))
    src1 = write_dump(tmp_path / "d1", as_rank(real_dump(), 1, 2, drop_after=13))
    procs = [start_standin(run, 0, src0), start_standin(run, 1, src1)]
    try:
        assert sorted(find_pipes(run)) == [0, 1]
        got = request_dumps(run, wait_s=15)
    finally:
        stop(procs)
    assert got.problems == {} and got.note == ""
    assert sorted(got.dumps) == [0, 1]
    assert got.dumps[1].groups["0"].enqueued == 13 and got.dumps[0].groups["0"].enqueued == 17


def test_a_fifo_nobody_reads_is_reported_at_once_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "pipe_3.pipe")
    assert "nobody reads" in poke(tmp_path / "pipe_3.pipe")
    got = request_dumps(tmp_path, wait_s=30)
    assert got.dumps == {} and "nobody reads" in got.problems[3]
    assert got.seconds < 5  # nothing was waited for: no dump was asked of anyone


def test_a_rank_that_does_not_answer_in_time_is_named_with_the_wait(tmp_path):
    src = write_dump(tmp_path / "d0", real_dump())
    procs = [start_standin(tmp_path, 0, src, delay=30)]
    try:
        got = request_dumps(tmp_path, wait_s=1.0)
    finally:
        stop(procs)
    assert got.dumps == {} and "no whole dump within 1 s" in got.problems[0]


def test_an_old_dump_left_from_before_is_not_taken_for_the_answer(tmp_path):
    (tmp_path / "fr_0").write_bytes((FIXTURES / "running" / "fr_0").read_bytes())
    os.utime(tmp_path / "fr_0", (1, 1))
    os.mkfifo(tmp_path / "pipe_0.pipe")
    fd = os.open(tmp_path / "pipe_0.pipe", os.O_RDONLY | os.O_NONBLOCK)  # a reader that ignores
    try:
        got = request_dumps(tmp_path, wait_s=0.5)
    finally:
        os.close(fd)
    assert got.dumps == {} and 0 in got.problems


def test_without_fifos_or_directory_the_round_says_what_to_set(tmp_path):
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in request_dumps(tmp_path, wait_s=0.1).note
    assert "not a directory" in request_dumps(tmp_path / "nope", wait_s=0.1).note
