"""monitor/hang/dump.py on the real H200 dumps, and on files that are not dumps."""

from __future__ import annotations

import os
import pickle

import pytest
from hang_standins import FIXTURES

from monitor.hang.dump import DumpError, parse_dump, read_dump


def test_stuck_kernel_dump_shows_the_queued_all_reduces():
    d = read_dump(FIXTURES / "stuck_kernel" / "fr_0")
    assert d.rank == 0 and d.version == "2.10"
    g = d.groups["0"]
    assert (g.enqueued, g.started, g.completed) == (17, -1, 13)
    assert g.desc == "default_pg" and g.ranks == (0,)
    assert [p.seq for p in g.pending] == [14, 15, 16, 17]
    assert {p.state for p in g.pending} == {"scheduled"}
    assert g.pending[0].name == "nccl:all_reduce"
    # the caller's frame, not torch's own all_reduce wrapper
    assert g.pending[0].frame.name == "_child"
    assert g.pending[0].frame.filename.endswith("bench/flight_recorder.py")


def test_running_dump_has_nothing_pending():
    g = read_dump(FIXTURES / "running" / "fr_0").groups["0"]
    assert g.enqueued == 1001 and g.pending == ()
    assert g.last_frame is not None and g.last_frame.name == "_child"


def test_a_pickle_that_names_a_function_is_refused_without_running_it(tmp_path):
    evil = tmp_path / "fr_3"
    evil.write_bytes(pickle.dumps({"pg_status": {}, "x": os.system}))
    with pytest.raises(DumpError, match="only plain data"):
        read_dump(evil)


@pytest.mark.parametrize("data, words", [
    (b"", "not a whole pickle"),
    ((FIXTURES / "running" / "fr_0").read_bytes()[:5000], "not a whole pickle"),
    (pickle.dumps([1, 2, 3]), "no pg_status"),
])
def test_what_is_not_a_dump_is_one_error_in_words(data, words):
    with pytest.raises(DumpError, match=words):
        parse_dump(data, 0)


def test_rank_comes_from_the_file_name_and_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(DumpError, match="no rank number"):
        read_dump(tmp_path / "dump")
    with pytest.raises(DumpError, match="No such file"):
        read_dump(tmp_path / "fr_1")
