"""Background work for collectors: one thread per collector, never inside a scrape.

A collector that derives from :class:`SampledCollector` implements :meth:`sample` (read the
source, store a fresh snapshot, push rows to the window and the store) and ``collect`` (build
metric families from the latest snapshot). The thread calls ``sample`` every
``ctx.interval`` seconds on a fixed schedule; an exception is caught, counted in ``errors``,
kept in ``last_error`` and logged once in words (again only when the message changes). A part
of the source that fails while the rest is published (the simulated host row) is reported
from inside ``sample`` with :meth:`SampledCollector.sample_failed`: the round counts as failed
the same way (``verlmon_collector_success 0`` while it lasts), and the first round that works
again logs the recovery once.

Counters derived from what others published (goodput, per-phase GPU activity) are the live
monitor's views, not collectors: monitor/live/live_view.py (``PollingView``).
"""

from __future__ import annotations

import logging
import threading
import time

from exporters.registry import BaseCollector, ExporterContext

log = logging.getLogger("verl_monitor.exporter")


class ProblemLog:
    """A source's problem, logged once in words (again only when the words change), and its
    end logged once: ``who: down`` as a warning (``down`` holds ``{}`` for the words), then
    ``who: up``. Sampling collectors keep one; the rollout collector one per server."""

    def __init__(self, who: str, down: str, up: str) -> None:
        self.who = who
        self.down = down
        self.up = up
        #: the words last logged, None while the source works
        self.words: str | None = None

    def failed(self, words: str) -> None:
        """The source fails with ``words``: logged when they are new."""
        if words != self.words:
            log.warning("%s: %s", self.who, self.down.format(words))
            self.words = words

    def recovered(self) -> None:
        """The source works: logged once when it failed before."""
        if self.words is not None:
            log.info("%s: %s", self.who, self.up)
            self.words = None


class SampledCollector(BaseCollector):
    """Base for collectors that sample on their own thread at the exporter's interval."""

    def __init__(self, ctx: ExporterContext) -> None:
        super().__init__(ctx)
        self.errors = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._problem = ProblemLog(f"collector {self.name}", "sampling failed: {}",
                                   "sampling works again")
        self._round_problem: str | None = None  # sample_failed's words in this round

    def sample(self) -> None:
        """Read the source once and publish a new snapshot (override)."""

    def sample_failed(self, words: str) -> None:
        """Called from :meth:`sample`: a part of the source failed in words, the rest is
        published. The round then counts as failed, as if ``sample`` had raised."""
        self._round_problem = words

    def sample_once(self) -> bool:
        """Run :meth:`sample` with error accounting; True when it worked."""
        self._round_problem = None
        try:
            self.sample()
        except Exception as exc:  # noqa: BLE001 - any failure is reported, never fatal
            return self._failed(f"{exc.__class__.__name__}: {exc}")
        if self._round_problem is not None:
            return self._failed(self._round_problem)
        self._problem.recovered()
        self.last_error = None
        self.samples += 1
        return True

    def _failed(self, message: str) -> bool:
        self.errors += 1
        self.last_error = message
        self._problem.failed(message)
        return False

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
