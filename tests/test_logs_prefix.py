"""What wraps a line's text: Ray's prefix, and the prefix of the process inside the actor
that printed it (vLLM's workers under verl's ``vLLMHttpServer``), whose dated lines date the
steps around them."""

from __future__ import annotations

import calendar
from pathlib import Path

import pytest

from monitor.logs.canonical_records import parse_file
from monitor.logs.prefix import unwrap
from monitor.logs.timestamps import set_log_timezone

#: vLLM's worker under verl's rollout server, as Ray prints it (coloured actor prefix, then
#: the worker's own).
WORKER = "\x1b[36m(vLLMHttpServer pid=5)\x1b[0m (Worker pid=6) "


@pytest.fixture(autouse=True)
def utc_logs():
    """Naive dates are read as UTC here; the zone is put back to the host's after."""
    set_log_timezone("UTC")
    yield
    set_log_timezone(None)


def test_the_prefix_of_the_process_inside_the_actor_is_taken_off() -> None:
    got = unwrap(WORKER + "INFO:2026-07-30 10:34:14,418:Loading standard weights\n")
    assert got.text == "INFO:2026-07-30 10:34:14,418:Loading standard weights"
    assert got.actor == "vLLMHttpServer"  # the actor stays Ray's
    stamped = unwrap("(TaskRunner pid=1) (EngineCore_DP0 pid=2) 2026-07-30 10:34:14,418 INFO x")
    assert stamped.text == "INFO x"
    assert stamped.time == pytest.approx(calendar.timegm((2026, 7, 30, 10, 34, 14)) + 0.418)
    # text in brackets that is not a process's prefix stays
    assert unwrap("(TaskRunner pid=1) (note) step:1").text == "(note) step:1"


def test_dated_worker_lines_behind_two_prefixes_date_the_steps_around_them(
        tmp_path: Path) -> None:
    """Step lines with no date of their own, each between two of a vLLM worker's dated lines
    0.4 s apart: each step ends between them (the clock of dated worker lines), not at a time
    rebuilt from the step timers."""
    lines = []
    for n in range(1, 4):
        lines += [f"{WORKER}INFO:2026-07-30 10:0{n}:00,000:Loading standard weights",
                  f"(TaskRunner pid=7) step:{n} - timing_s/gen:30.0 - "
                  "timing_s/update_actor:20.0 - timing_s/step:60.0",
                  f"{WORKER}INFO:2026-07-30 10:0{n}:00,400:Loading standard weights"]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log).steps
    assert [s.time_source for s in steps] == ["worker"] * 3
    start = calendar.timegm((2026, 7, 30, 10, 0, 0))
    assert [s.end_time - start for s in steps] == pytest.approx([60.2, 120.2, 180.2])
