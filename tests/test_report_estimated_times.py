"""A log with no clock has its times rebuilt (ending at the file's modification time): the
report marks every such time "(estimated)", so a January log is not read as run today
(issue 31 item 5)."""

from __future__ import annotations

from cli.main import main


def _log(path, stamped: bool) -> None:
    lines = []
    for i in range(1, 11):
        stamp = f"2026-01-0{1 + i // 10} 10:{i:02d}:00 " if stamped else ""
        lines.append(f"{stamp}step:{i} - timing_s/step:12.0 - timing_s/gen:6.0 - "
                     "timing_s/update_actor:3.0 - perf/throughput:1000.0")
    path.write_text("\n".join(lines) + "\n")


def test_times_of_a_log_without_a_clock_are_run_time_not_dates(tmp_path, capsys) -> None:
    """No line dates the steps: the report gives run time from the start, never a date the
    file's modification time would have made up (issue 37)."""
    log = tmp_path / "train.log"
    _log(log, stamped=False)
    assert main(["analyze", str(log)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("from ")]
    assert line.count("(run time)") == 2 and "UTC" not in line, line
    assert "times: relative to the run's start" in out


def test_measured_times_are_not_marked(tmp_path, capsys) -> None:
    log = tmp_path / "train.log"
    _log(log, stamped=True)
    assert main(["analyze", str(log)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("from ")]
    assert "estimated" not in line.split(";")[0] and "2026-01-01" in line, line
