"""monitor/hang/localize.py: the cross-rank comparison, on the real H200 dumps turned into ranks."""

from __future__ import annotations

import pickle

from hang_standins import as_rank, real_dump

from monitor.hang.dump import parse_dump
from monitor.hang.localize import RankInfo, localize_dumps


def _dump(d: dict, rank: int):
    return parse_dump(pickle.dumps(d), rank)


def test_the_rank_that_never_issued_the_collective_is_named_with_its_frame():
    base = real_dump()
    dumps = {0: _dump(as_rank(base, 0, 4), 0), 1: _dump(as_rank(base, 1, 4), 1),
             2: _dump(as_rank(base, 2, 4, drop_after=13), 2), 3: _dump(as_rank(base, 3, 4), 3)}
    loc = localize_dumps(dumps, infos={2: RankInfo(node="n1", gpu=2, pid=4242)})
    assert [c.rank for c in loc.culprits] == [2]
    c = loc.culprits[0]
    assert c.seq == 14 and c.collective == "nccl:all_reduce" and (c.gpu, c.pid) == (2, 4242)
    assert "never issued" in c.reason and c.frame.name == "_child"
    assert sorted(loc.waiting) == [0, 1, 3]
    text = loc.summary()
    assert "rank 2 (node n1, GPU 2, PID 4242)" in text and "flight_recorder.py" in text


def test_a_rank_without_a_dump_while_the_others_wait_is_named():
    base = real_dump()
    dumps = {0: _dump(as_rank(base, 0, 2), 0)}
    loc = localize_dumps(dumps, missing={1: "nobody reads its FIFO"})
    assert [c.rank for c in loc.culprits] == [1]
    assert "nobody reads its FIFO" in loc.culprits[0].reason
    assert list(loc.waiting) == [0]


def test_with_start_tracking_the_rank_whose_gpu_never_started_it_is_named():
    base = real_dump()
    a, b = as_rank(base, 0, 2), as_rank(base, 1, 2)
    a["pg_status"]["0"]["last_started_collective"] = 14
    b["pg_status"]["0"]["last_started_collective"] = 13
    loc = localize_dumps({0: _dump(a, 0), 1: _dump(b, 1)})
    assert [c.rank for c in loc.culprits] == [1]
    assert "never started" in loc.culprits[0].reason


def test_a_lone_rank_with_work_queued_behind_a_kernel_is_stuck_in_it():
    loc = localize_dumps({0: _dump(real_dump(), 0)})
    assert [c.rank for c in loc.culprits] == [0]
    assert "stuck in a kernel" in loc.culprits[0].reason


def test_ranks_level_with_nothing_to_tell_them_apart_name_nobody_and_say_why():
    base = real_dump()
    loc = localize_dumps({0: _dump(as_rank(base, 0, 2), 0), 1: _dump(as_rank(base, 1, 2), 1)})
    assert loc.culprits == []
    assert "TORCH_NCCL_ENABLE_TIMING" in loc.summary()


def test_a_running_job_has_no_pending_collective():
    loc = localize_dumps({0: _dump(real_dump("running"), 0)})
    assert loc.culprits == [] and "not waiting" in loc.summary()
