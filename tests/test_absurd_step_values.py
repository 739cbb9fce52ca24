"""Issue 30 row 8: absurd step values (a step of 1e12 s, 1e308 s, a negative phase) are counted
and skipped in every output, instead of killing `analyze` with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from monitor.logs.canonical_records import parse_file

GOOD = "timing_s/gen:5.0 - timing_s/update_actor:4.0 - timing_s/step:12.5"


def write_log(path: Path, absurd: str, fmt: str) -> None:
    lines = []
    for step in range(1, 9):
        step_time = absurd if step == 4 else "12.5"
        if fmt == "console":
            lines.append(f"step:{step} - timing_s/gen:5.0 - timing_s/update_actor:4.0 - "
                         f"timing_s/step:{step_time} - perf/throughput:100.0")
        else:
            lines.append(json.dumps({"step": step, "data": {
                "timing_s/gen": 5.0, "timing_s/update_actor": 4.0,
                "timing_s/step": float(step_time), "perf/throughput": 100.0}}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("fmt", ["console", "jsonl"])
@pytest.mark.parametrize("absurd", ["1e12", "1e308", "-40.0"])
def test_an_absurd_step_time_is_counted_and_skipped(tmp_path: Path, capsys, absurd: str,
                                                     fmt: str) -> None:
    """Before: `analyze` died with ValueError (1e12) or OverflowError (1e308)."""
    log = tmp_path / ("train.log" if fmt == "console" else "train.jsonl")
    write_log(log, absurd, fmt)
    parsed = parse_file(log)
    assert len(parsed.steps) == 8  # the step is kept, its absurd value is not
    bad = next(s for s in parsed.steps if s.step == 4)
    assert "timing_s/step" not in bad.metrics and bad.total is None
    assert all(s.total == 12.5 for s in parsed.steps if s.step != 4)
    assert parsed.stats.parse_errors == 1
    assert "timing_s/step" in parsed.stats.error_samples[0]
    code = main(["analyze", str(log)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and "1 unreadable" in out
    code = main(["analyze", "--json", str(log)])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["parse"]["parse_errors"] == 1
    assert absurd not in json.dumps(doc.get("steps", []))


def test_the_live_path_stores_no_absurd_value(tmp_path: Path) -> None:
    """The exporter's parser (what the dashboard reads through the store) skips it too."""
    from monitor.logs.canonical_records import LogParser
    from monitor.store import RunStore

    parser = LogParser("live.log")
    records = []
    for step in range(1, 6):
        value = "1e308" if step == 3 else "12.5"
        records += parser.feed(f"step:{step} - timing_s/gen:5.0 - timing_s/step:{value}",
                               arrival_time=1_700_000_000.0 + 15 * step)
    store = RunStore(tmp_path / "run.db")
    store.add_steps([r for r in records if hasattr(r, "phases")])
    totals = [s.total for s in store.steps()]
    store.close()
    assert totals == [12.5, 12.5, None, 12.5, 12.5]
    assert parser.stats.parse_errors == 1
