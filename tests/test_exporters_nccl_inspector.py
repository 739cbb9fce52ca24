"""NCCL Inspector line parsing, on the fixture dump and on hand-made lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.nccl_inspector import NcclParseError, is_dump_file, parse_line

FIXTURE = Path(__file__).parent / "fixtures" / "nccl_inspector" / "gpu-node-01-pid4242.log"


def _parse_all(path: Path):
    records, garbage, skipped = [], 0, 0
    for line in path.read_text().splitlines():
        try:
            rec = parse_line(line)
        except NcclParseError:
            garbage += 1
            continue
        if rec is None:
            skipped += 1
        else:
            records.append(rec)
    return records, garbage, skipped


def test_fixture_records_in_base_units():
    records, garbage, skipped = _parse_all(FIXTURE)
    assert [r.coll for r in records] == ["AllReduce", "AllReduce", "ReduceScatter", "Send"]
    big = records[0]
    assert big.comm == "DP Group 0"  # comm_name wins over the id
    assert big.rank == 0 and big.n_ranks == 8
    assert big.msg_bytes == 17179869184
    assert big.exec_seconds == pytest.approx(0.061974)
    assert big.busbw_bytes_per_s == pytest.approx(485.119099e9)
    assert big.ts == pytest.approx(1748030377.748202)
    assert big.process == ("gpu-node-01", 4242)
    assert records[2].comm == "0x9e7a479f95a66c"  # no comm_name: the id
    assert records[3].p2p and records[3].exec_seconds == pytest.approx(50e-6)
    # not JSON, a size that is text, a line cut in the middle
    assert garbage == 3
    assert skipped == 1  # the dump_stats record is bookkeeping, not garbage


@pytest.mark.parametrize(
    "line, why",
    [
        ("[1, 2]", "not a JSON object"),
        ('{"foo": 1}', "neither coll_perf nor p2p_perf"),
        ('{"coll_perf": {"coll_msg_size_bytes": 1, "coll_exec_time_us": 1}}', "name missing"),
        ('{"coll_perf": {"coll": "AllReduce", "coll_msg_size_bytes": 1, '
         '"coll_exec_time_us": -5}}', "negative"),
        ('{"coll_perf": {"coll": "AllReduce", "coll_msg_size_bytes": 1}}', "not a number"),
    ],
)
def test_bad_lines_say_why(line, why):
    with pytest.raises(NcclParseError, match=why):
        parse_line(line)


def test_blank_line_and_optional_fields():
    assert parse_line("   ") is None
    rec = parse_line(json.dumps({"coll_perf": {"coll": "Broadcast", "coll_msg_size_bytes": 8,
                                               "coll_exec_time_us": 3}}))
    assert rec is not None
    assert rec.comm == "unknown" and rec.busbw_bytes_per_s is None and rec.ts is None


def test_dump_file_names():
    assert is_dump_file("/x/gpu-node-01-pid4242.log")
    assert not is_dump_file("/x/notes.log")


def test_deep_nesting_and_long_lines_are_parse_errors():
    """Before: a deeply nested line raised RecursionError, which no caller expected."""
    with pytest.raises(NcclParseError, match="nested too deeply"):
        parse_line("[" * 20_000)
    with pytest.raises(NcclParseError, match="longer than"):
        parse_line('{"a": "' + "x" * (70 * 1024) + '"}')
