"""Background sampling: a thread per collector, errors counted and logged once, clean stop."""

from __future__ import annotations

import logging
import time

from exporters.registry import ExporterContext
from exporters.sampling import SampledCollector
from monitor.live.live_view import PollingView as PollingCollector


class Flaky(SampledCollector):
    name = "flaky"

    def __init__(self, ctx, fail_first: int) -> None:
        super().__init__(ctx)
        self.calls = 0
        self.fail_first = fail_first
        self.closed = False

    def sample(self) -> None:
        self.calls += 1
        if self.calls <= self.fail_first:
            raise OSError("sensor busy")

    def close(self) -> None:
        self.closed = True


def ctx(interval: float = 0.1) -> ExporterContext:
    return ExporterContext(node="n0", interval=interval)


def wait_for(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def test_samples_repeatedly_in_the_background_and_stops():
    col = Flaky(ctx(), fail_first=0)
    col.start()
    assert col.calls >= 1  # the first sample happens in start(): metrics from the first scrape
    wait_for(lambda: col.calls >= 4)
    col.stop()
    calls = col.calls
    assert col.closed
    time.sleep(0.3)
    assert col.calls == calls  # really stopped
    assert col.healthy() and col.errors == 0 and col.samples == calls


def test_errors_are_counted_logged_once_and_recovery_clears_them(caplog):
    col = Flaky(ctx(), fail_first=3)
    with caplog.at_level(logging.INFO, logger="verl_monitor.exporter"):
        for _ in range(3):
            assert not col.sample_once()
        assert not col.healthy()
        assert col.last_error == "OSError: sensor busy"
        assert col.errors == 3
        assert col.sample_once()
    assert col.healthy() and col.last_error is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "flaky" in warnings[0].getMessage()
    assert any("works again" in r.getMessage() for r in caplog.records)


class FlakyPoller(PollingCollector):
    """Fails its first polls, then works; records whether the collector looked healthy."""

    name = "poller"
    thread_name = "test-poller"

    def __init__(self, ctx, fail_first: int) -> None:
        super().__init__(ctx)
        self.calls = 0
        self.fail_first = fail_first
        self.seen_errors: list[str | None] = []

    def poll_once(self) -> None:
        self.seen_errors.append(self.last_error)  # what a scrape saw before this poll
        self.calls += 1
        if self.calls <= self.fail_first:
            raise OSError("driver's /metrics refused the connection")


def test_a_poller_reports_a_failed_round_in_words_once_and_recovers(monkeypatch, caplog):
    import monitor.live.live_view as sampling

    monkeypatch.setattr(sampling, "MIN_POLL_S", 0.05)
    col = FlakyPoller(ctx(0.05), fail_first=2)
    with caplog.at_level(logging.WARNING, logger="verl_monitor.exporter"):
        col.start()
        wait_for(lambda: col.calls >= 4)
        col.stop()
    message = "OSError: driver's /metrics refused the connection"
    assert col.seen_errors[:4] == [None, message, message, None]
    assert col.healthy()  # the later rounds worked
    warnings = [r.getMessage() for r in caplog.records if "poller" in r.getMessage()]
    assert warnings == [f"poller: {message}"]  # logged once for the repeated reason
    calls = col.calls
    time.sleep(0.2)
    assert col.calls == calls  # really stopped
