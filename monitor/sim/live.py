"""Play a simulated run into a log file in real time (the demo and the exporter's sim backend).

``LiveSim(run, "train.log", speed=10).start()`` re-bases the run so it starts now, writes the
preamble at once, then appends each line when the wall clock passes its simulated time (scaled
by ``speed``). ``now_sim()`` gives the simulated instant matching the wall clock, to pass to
``run.gpu_sample_at``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from monitor.sim.engine import SimRun


class LiveSim:
    """Appends a :class:`SimRun`'s lines to ``log_path`` as (scaled) wall-clock time passes."""

    def __init__(self, run: SimRun, log_path: str | os.PathLike[str], speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.run = run
        self.log_path = Path(log_path)
        self.speed = float(speed)
        self._wall0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines_written = 0
        self.error: Exception | None = None

    def start(self) -> None:
        """Re-base the run to start now and start the writer thread (a daemon)."""
        if self._thread is not None:
            raise RuntimeError("LiveSim already started")
        now = time.time()
        self._wall0 = now
        self.run.rebase(now)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="verl-monitor-livesim", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop writing and wait (bounded) for the thread to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """True while lines remain to be written and ``stop()`` was not called."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """True once every line of the run has been written."""
        return self._thread is not None and not self._thread.is_alive() and not self._stop.is_set()

    def now_sim(self) -> float:
        """The simulated time matching the wall clock now (``run.start_time`` at ``start()``)."""
        if self._wall0 is None:
            return self.run.start_time
        return self.run.start_time + (time.time() - self._wall0) * self.speed

    def wall_time_of(self, t_sim: float) -> float:
        """The wall-clock time at which simulated time ``t_sim`` is reached."""
        wall0 = self._wall0 if self._wall0 is not None else time.time()
        return wall0 + (t_sim - self.run.start_time) / self.speed

    def _loop(self) -> None:
        try:
            lines = self.run.timed_lines()
            with self.log_path.open("a", encoding="utf-8") as fh:
                for t_sim, text in lines:
                    while not self._stop.is_set():
                        wait = self.wall_time_of(t_sim) - time.time()
                        if wait <= 0:
                            break
                        self._stop.wait(min(wait, 0.5))
                    if self._stop.is_set():
                        return
                    fh.write(text + "\n")
                    fh.flush()
                    self.lines_written += 1
        except Exception as exc:  # reported through .error; the thread must end
            self.error = exc
