"""Leading timestamps: ISO 8601 with offsets, bracketed, Python logging's comma form."""

from __future__ import annotations

import os
import time

import pytest

from monitor.logs.timestamps import (
    log_timezone,
    parse_timestamp,
    set_log_timezone,
    split_timestamp,
)

BASE = 1767323045.0  # 2026-01-02T03:04:05Z


@pytest.fixture(autouse=True)
def utc_logs():
    """These cases read naive times as UTC; the zone is put back to the host's after."""
    set_log_timezone("UTC")
    yield
    set_log_timezone(None)


@pytest.mark.parametrize(
    ("line", "expected", "rest"),
    [
        ("2026-01-02T03:04:05Z step:1", BASE, "step:1"),
        ("2026-01-02T03:04:05.123Z step:1", BASE + 0.123, "step:1"),
        ("2026-01-02T05:04:05+02:00 x", BASE, "x"),
        ("2026-01-01T22:04:05.5-0500 x", BASE + 0.5, "x"),
        ("2026-01-02T03:04:05 naive", BASE, "naive"),  # naive: in the zone set (UTC here)
        ("[2026-01-02 03:04:05] (TaskRunner pid=1) y", BASE, "(TaskRunner pid=1) y"),
        ("[2026-01-02 03:04:05.250] y", BASE + 0.25, "y"),
        ("2026-01-02 03:04:05,123 INFO z", BASE + 0.123, "INFO z"),
        ("  2026-01-02 03:04:05 indented", BASE, "indented"),
        ("2026-01-02T03:04:05.123456789Z ns", BASE + 0.123456789, "ns"),
    ],
)
def test_split_timestamp(line: str, expected: float, rest: str) -> None:
    value, remainder = split_timestamp(line)
    assert value == pytest.approx(expected, abs=1e-6)
    assert remainder == rest


@pytest.mark.parametrize(
    "line",
    [
        "step:1 - a:1",
        "2026-13-02T03:04:05Z month 13",
        "2026-01-02T25:04:05Z hour 25",
        "2026-01-02",
        "20260102T030405Z",
        "",
        "[not a time]",
        "12:00:00 time only",
    ],
)
def test_lines_without_a_valid_timestamp_are_left_alone(line: str) -> None:
    assert split_timestamp(line) == (None, line)


def test_parse_timestamp_needs_the_whole_string() -> None:
    assert parse_timestamp("2026-01-02T03:04:05Z") == BASE
    assert parse_timestamp(" 2026-01-02 03:04:05 ") == BASE
    assert parse_timestamp("2026-01-02T03:04:05Z trailing") is None
    assert parse_timestamp("yesterday") is None


@pytest.fixture
def host_tz():
    """Set the host's zone (the ``TZ`` variable, applied with ``time.tzset``); put back after."""
    old = os.environ.get("TZ")

    def use(name: str) -> None:
        os.environ["TZ"] = name
        time.tzset()

    yield use
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.mark.parametrize(("tz", "hours"), [("EST+05", 5), ("JST-09", -9), ("UTC0", 0)])
def test_naive_times_are_read_in_the_hosts_zone(host_tz, tz: str, hours: int) -> None:
    """Python logging's default ``%(asctime)s`` is the host's local time (issue 30 row 5)."""
    set_log_timezone(None)
    host_tz(tz)
    asctime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(BASE)) + ",250"
    assert split_timestamp(f"{asctime} INFO step:1")[0] == pytest.approx(BASE + 0.25)
    value, _ = split_timestamp("2026-01-02 03:04:05,000 INFO x")
    assert value == pytest.approx(BASE + hours * 3600)
    # a timestamp with an offset is read as written, whatever the host's zone
    assert split_timestamp("2026-01-02T03:04:05Z x")[0] == BASE


@pytest.mark.parametrize(("zone", "hours"), [
    ("America/New_York", 5), ("Asia/Tokyo", -9), ("+05:30", -5.5), ("-0800", 8), ("UTC", 0),
])
def test_naive_times_in_the_zone_set_by_option(host_tz, zone: str, hours: float) -> None:
    host_tz("UTC0")  # the option wins over the host's zone
    set_log_timezone(zone)
    assert split_timestamp("2026-01-02 03:04:05 x")[0] == pytest.approx(BASE + hours * 3600)


@pytest.mark.parametrize("bad", ["Mars/Olympus", "+25:00", "+05:75", "EST5EDT4,garbage"])
def test_an_unknown_zone_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="time zone"):
        log_timezone(bad)
    assert log_timezone("local") is None


@pytest.mark.slow
@pytest.mark.parametrize(("option", "hours"), [([], 14), (["--log-timezone", "Asia/Tokyo"], 0),
                                               (["--log-timezone", "UTC"], 9)])
def test_analyze_reads_naive_times_in_the_hosts_zone_or_the_option(tmp_path, option, hours):
    """`analyze` on a host 5 hours west of UTC: the log's naive 12:04:05 is 17:04:05 UTC,
    unless --log-timezone says where the log was written."""
    import json
    import subprocess
    import sys

    log = tmp_path / "train.log"
    log.write_text("".join(f"2026-01-02 12:04:{5 + 10 * i:02d},000 INFO step:{i + 1} - "
                           "timing_s/step:10.0 - timing_s/gen:5.0\n" for i in range(3)))
    out = subprocess.run([sys.executable, "-m", "monitor", "analyze", str(log), "--json",
                          *option], env={**os.environ, "TZ": "EST+05"}, capture_output=True,
                         text=True, timeout=120, check=True)
    ends = [s["end_time"] for s in json.loads(out.stdout)["steps"]]
    assert ends == [BASE + hours * 3600 + 10 * i for i in range(3)]


@pytest.mark.parametrize(("shift", "words"), [(86400.0, "after the log's last write"),
                                              (-3 * 366 * 86400.0, "over a year before the log")])
def test_analyze_does_not_trust_a_step_dated_in_the_future_or_long_ago(tmp_path, shift, words):
    """One node's clock is a day ahead (or years behind): that step's date is not used (its
    time is rebuilt from its neighbours), and it is counted, saying why."""
    from monitor.logs.files import parse_file

    now = time.time()
    lines = []
    for i in range(1, 6):
        t = now - (5 - i) * 30.0 + (shift if i == 3 else 0.0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        lines.append(f"{stamp} step:{i} - timing_s/step:30.0 - timing_s/gen:10.0\n")
    log = tmp_path / "train.log"
    log.write_text("".join(lines))
    parsed = parse_file(log, log_end=now + 1)
    sources = [s.time_source for s in parsed.steps]
    assert sources[2] != "line" and sources[:2] + sources[3:] == ["line"] * 4
    ends = [s.end_time for s in parsed.steps]
    assert ends == sorted(ends) and abs(ends[2] - (now - 60)) < 31
    assert parsed.stats.parse_errors == 1 and words in parsed.stats.error_samples[0]


def test_an_old_log_copied_today_keeps_its_dates(tmp_path):
    from monitor.logs.files import parse_file

    log = tmp_path / "old.log"
    log.write_text("".join(f"2023-05-01T10:00:{i * 10:02d}Z step:{i} - timing_s/step:10.0\n"
                           for i in range(1, 4)))
    parsed = parse_file(log)  # its last write is today, three years after its lines
    assert [s.time_source for s in parsed.steps] == ["line"] * 3
    assert parsed.stats.parse_errors == 0


#: 2026-11-01 04:10 UTC: 00:10 in New York (EDT); at 06:00 UTC the clocks there go back from
#: 02:00 EDT to 01:00 EST, so 01:00-01:59 is printed twice.
FALL_BACK_START = 1793506200.0


def _dst_log(tmp_path, host_tz_or_zone: str, dated_worker_lines: bool | str):
    """Steps every 10 minutes through New York's fall-back hour, stamped in its wall-clock
    time as Python logging's ``%(asctime)s`` prints it (naive), each step line stamped, or
    (``dated_worker_lines``) a dated worker line before each unstamped step line, or
    (``"hms"``) a time of day at the start of each step line after one dated line."""
    import zoneinfo
    from datetime import datetime, timezone

    zone = zoneinfo.ZoneInfo("America/New_York")
    lines = []
    truth = []
    for i in range(18):
        t = FALL_BACK_START + 600.0 * i
        stamp = datetime.fromtimestamp(t, tz=timezone.utc).astimezone(zone).strftime(
            "%Y-%m-%d %H:%M:%S,000")
        truth.append(t)
        body = f"step:{i + 1} - timing_s/gen:300.0 - timing_s/step:600.0"
        if dated_worker_lines == "hms":
            if i == 0:
                lines.append(f"{stamp} INFO the trainer starts\n")
            lines.append(f"(TaskRunner pid=4) {stamp[11:19]} {body}\n")
        elif dated_worker_lines:
            lines.append(f"(WorkerDict pid=5) {stamp} INFO done\n(TaskRunner pid=4) {body}\n")
        else:
            lines.append(f"{stamp} INFO {body}\n")
    log = tmp_path / "dst_fall.log"
    log.write_text("".join(lines))
    os.utime(log, (truth[-1] + 1, truth[-1] + 1))
    return log, truth


@pytest.mark.parametrize("dated_worker_lines", [False, True, "hms"])
@pytest.mark.parametrize("how", ["option", "host"])
def test_naive_stamps_through_a_dst_fall_back_stay_in_order(tmp_path, host_tz, how,
                                                            dated_worker_lines):
    """Round 5 N18: the second 01:00-01:50 (EST) was read as the first (EDT), an hour early,
    before the steps it follows: a false stalled and a phantom hour of data wait. An
    ambiguous wall-clock time is read as the one that keeps the log in order."""
    from cli.commands.analyze import build_document  # noqa: F401 (the same reader)
    from monitor.logs.files import parse_file
    from tests.real_logs import analyze_doc

    if how == "option":
        host_tz("UTC0")
        set_log_timezone("America/New_York")
    else:
        host_tz("EST5EDT,M3.2.0,M11.1.0")
        set_log_timezone(None)
    log, truth = _dst_log(tmp_path, how, dated_worker_lines)
    ends = [s.end_time for s in parse_file(log).steps]
    if dated_worker_lines in (False, "hms"):
        assert ends == truth
    assert ends == sorted(ends)
    assert max(b - a for a, b in zip(ends, ends[1:], strict=False)) < 700
    doc = analyze_doc(log)
    assert [f["kind"] for f in doc["flags"] if f["kind"] == "stalled"] == []
