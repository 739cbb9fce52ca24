"""Background work for collectors: one thread per collector, never inside a scrape.

A collector that derives from :class:`SampledCollector` implements :meth:`sample` (read the
source, store a fresh snapshot, push rows to the window and the store) and ``collect`` (build
metric families from the latest snapshot). The thread calls ``sample`` every
``ctx.interval`` seconds on a fixed schedule; an exception is caught, counted in ``errors``,
kept in ``last_error`` and logged once in words (again only when the message changes).

A collector that derives counters from what others published (goodput, per-phase GPU activity)
derives from :class:`PollingCollector` instead and implements :meth:`PollingCollector.poll_once`:
its thread calls it every ``poll_s`` seconds (the interval, at least ``MIN_POLL_S``), the first
call one period after start (a step's last GPU samples are still arriving when it ends).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import ClassVar

from exporters.registry import BaseCollector, ExporterContext

log = logging.getLogger("verl_monitor.exporter")

#: Shortest poll interval of a PollingCollector (seconds).
MIN_POLL_S = 1.0


class SampledCollector(BaseCollector):
    """Base for collectors that sample on their own thread at the exporter's interval."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        self.errors = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged_error: str | None = None

    def sample(self) -> None:
        """Read the source once and publish a new snapshot (override)."""

    def sample_once(self) -> bool:
        """Run :meth:`sample` with error accounting; True when it worked."""
        try:
            self.sample()
        except Exception as exc:  # noqa: BLE001 - any failure is reported, never fatal
            message = f"{exc.__class__.__name__}: {exc}"
            self.errors += 1
            self.last_error = message
            if message != self._logged_error:
                log.warning("collector %s: sampling failed: %s", self.name, message)
                self._logged_error = message
            return False
        if self.last_error is not None:
            log.info("collector %s: sampling works again", self.name)
        self.last_error = None
        self._logged_error = None
        self.samples += 1
        return True

    def start(self) -> None:
        """Take a first sample now, then keep sampling in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self.sample_once()
        self._thread = threading.Thread(
            target=self._loop, name=f"collector-{self.name}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        interval = max(float(self.ctx.interval), 0.01)
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.sample_once()
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # fell behind (slow source): skip missed ticks, no burst
                next_at = now + interval

    def stop(self) -> None:
        """Stop the thread (waits up to a few seconds) and release resources."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self.close()

    def close(self) -> None:
        """Release files and handles (override)."""


class PollingCollector(BaseCollector):
    """Base for collectors that look for new work every ``poll_s`` seconds on their thread.

    An exception from :meth:`poll_once` never ends the thread: it is kept in ``last_error``
    (``collector_success 0``) and logged once per message; a poll that works clears it.
    """

    #: the thread's name
    thread_name: ClassVar[str] = "poller"

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        self.poll_s = max(float(ctx.interval), MIN_POLL_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged_error: str | None = None

    def poll_once(self) -> None:
        """Do one round of work (override)."""

    def error_text(self, exc: Exception) -> str:
        """The words for a failed poll (override for errors that already say it all)."""
        return f"{type(exc).__name__}: {exc}"

    def start(self) -> None:
        """Start the thread that calls :meth:`poll_once` every ``poll_s`` seconds."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits up to a few seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - a bad round must not end the thread
                self.last_error = self.error_text(exc)
                if self._logged_error != self.last_error:
                    log.warning("%s: %s", self.name, self.last_error)
                    self._logged_error = self.last_error
                continue
            self.last_error = None
            self._logged_error = None
