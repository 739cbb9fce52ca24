"""FlagTracker: stable starts across calls, closes with an end, counts raised flags."""

from monitor.live.flag_tracker import FlagTracker
from monitor.records import Flag


def _flag(kind="gpu_imbalance", start=100.0, end=None, sev="warning", gpus=(3,)):
    return Flag(kind=kind, severity=sev, start=start, end=end,
                scope={"node": "n0", "gpus": list(gpus)}, evidence="e")


def test_flag_keeps_its_first_start_while_open():
    tr = FlagTracker()
    opened, closed = tr.update([_flag(start=100.0)], now=110.0)
    assert [f.start for f in opened] == [100.0] and closed == []
    # the next window only sees the problem from 130 on: same flag, original start
    opened, closed = tr.update([_flag(start=130.0)], now=140.0)
    assert opened == [] and closed == []
    assert [f.start for f in tr.active()] == [100.0]


def test_flag_closes_with_an_end_time_when_no_longer_reported():
    tr = FlagTracker()
    tr.update([_flag(start=100.0)], now=110.0)
    opened, closed = tr.update([], now=200.0)
    assert opened == []
    assert len(closed) == 1 and closed[0].start == 100.0 and closed[0].end == 200.0
    assert tr.active() == []


def test_reported_end_is_used_when_the_detector_closed_it():
    tr = FlagTracker()
    tr.update([_flag(start=100.0)], now=110.0)
    _, closed = tr.update([_flag(start=120.0, end=150.0)], now=170.0)
    assert closed[0].end == 150.0 and closed[0].start == 100.0


def test_a_flag_that_began_and_ended_between_two_calls_is_kept_once():
    """The detectors did not run while a spike lasted (a busy machine, a sped-up replay): the
    next call sees it ended, and it is still raised (opened and closed), once."""
    tr = FlagTracker()
    assert tr.update([], now=100.0) == ([], [])
    spike = _flag(kind="reshard_spike", start=120.0, end=150.0, gpus=())
    opened, closed = tr.update([spike], now=170.0)
    assert [(f.kind, f.start) for f in opened] == [("reshard_spike", 120.0)]
    assert [(f.kind, f.start, f.end) for f in closed] == [("reshard_spike", 120.0, 150.0)]
    assert tr.raised_counts() == {("reshard_spike", "warning"): 1}
    assert tr.active() == []
    # the same ended episode in the next windows: nothing new, counted once
    assert tr.update([spike], now=180.0) == ([], [])
    assert tr.raised_counts() == {("reshard_spike", "warning"): 1}


def test_an_ended_flag_from_before_the_first_call_is_not_raised_again():
    """The first call (an exporter started mid-run reads the log from its start) raises only
    what is open: episodes that ended before it watched are not paged as new."""
    tr = FlagTracker()
    assert tr.update([_flag(start=10.0, end=40.0)], now=500.0) == ([], [])
    assert tr.raised_counts() == {}


def test_an_open_flag_that_ends_is_closed_not_raised_twice():
    tr = FlagTracker()
    tr.update([_flag(start=100.0)], now=110.0)
    opened, closed = tr.update([_flag(start=100.0, end=130.0)], now=140.0)
    assert opened == [] and [(f.start, f.end) for f in closed] == [(100.0, 130.0)]
    assert tr.raised_counts() == {("gpu_imbalance", "warning"): 1}


def test_different_scopes_are_different_flags_and_counts_add_up():
    tr = FlagTracker()
    opened, _ = tr.update([_flag(gpus=(3,)), _flag(gpus=(5,)), _flag(kind="oom", sev="critical")],
                          now=110.0)
    assert len(opened) == 3
    assert tr.raised_counts() == {("gpu_imbalance", "warning"): 2, ("oom", "critical"): 1}
    # the same flags again raise nothing new
    tr.update([_flag(gpus=(3,)), _flag(gpus=(5,)), _flag(kind="oom", sev="critical")], now=120.0)
    assert sum(tr.raised_counts().values()) == 3


def test_severity_escalation_is_counted_and_kept():
    tr = FlagTracker()
    tr.update([_flag(sev="warning")], now=110.0)
    tr.update([_flag(sev="critical")], now=120.0)
    tr.update([_flag(sev="warning")], now=130.0)
    assert tr.active()[0].severity == "critical"
    assert tr.raised_counts()[("gpu_imbalance", "critical")] == 1


def test_reopening_after_close_counts_again():
    tr = FlagTracker()
    tr.update([_flag()], now=110.0)
    tr.update([], now=120.0)
    opened, _ = tr.update([_flag(start=300.0)], now=310.0)
    assert len(opened) == 1 and opened[0].start == 300.0
    assert tr.raised_counts()[("gpu_imbalance", "warning")] == 2


def test_adopted_flags_keep_their_start_and_open_nothing_new():
    tracker = FlagTracker()
    assert tracker.adopt([_flag(start=100.0), _flag(kind="oom", start=50.0, gpus=()),
                          _flag(kind="stalled", start=10.0, end=20.0)], reason="gone") == 2
    opened, closed = tracker.update([_flag(start=90.0)], now=200.0)  # still true
    assert opened == [] and [f.kind for f in closed] == ["oom"]
    assert closed[0].end == 200.0 and closed[0].evidence == "e (gone)"
    assert [(f.kind, f.start) for f in tracker.active()] == [("gpu_imbalance", 100.0)]
    assert tracker.raised_counts() == {}
    opened, closed = tracker.update([], now=300.0)  # seen again before: an ordinary close
    assert closed[0].evidence == "e" and closed[0].start == 100.0
