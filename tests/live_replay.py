"""Replaying a recorded real run through the live monitor on the run's own clock (test helper).

``Replay(fixture, options)`` feeds the window the GPU rows, steps and events of a
``tests/fixtures/real_verl/<case>`` recording up to a time and runs the detectors there, as
the exporter would have at that moment."""

from __future__ import annotations

from pathlib import Path

from exporters.options import ExporterOptions
from monitor.frames import read_gpu_frame
from monitor.live.live_monitor import LiveMonitor
from monitor.logs.canonical_records import parse_file
from monitor.records import Flag

REAL_VERL = Path(__file__).parent / "fixtures" / "real_verl"


class _OnItsClock(LiveMonitor):
    clock = 0.0

    def now(self) -> float:
        return self.clock


class Replay:
    """A recorded run (``REAL_VERL / case``) fed to a live monitor built from ``options``."""

    def __init__(self, case: str, options: ExporterOptions) -> None:
        d = REAL_VERL / case
        self.parsed = parse_file(str(d / "train.log"))
        self.gpu = read_gpu_frame(d / "gpu.csv")
        self.monitor = _OnItsClock(options, "h200", 1.0)
        self.monitor.open()
        self._fed = 0.0

    def until(self, t: float) -> tuple[list[Flag], list[Flag]]:
        """Feed everything recorded up to ``t``, run the detectors at ``t``: (opened, closed)."""
        mon, gpu, fed = self.monitor, self.gpu, self._fed
        mon.window.add_rows("gpu", gpu[(gpu["ts"] > fed) & (gpu["ts"] <= t)].to_dict("records"))
        mon.window.add_steps([s for s in self.parsed.steps if fed < s.end_time <= t])
        mon.window.add_events([e for e in self.parsed.events
                               if e.time is not None and fed < e.time <= t])
        self._fed = mon.clock = t
        return mon.detect_once()

    def close(self) -> None:
        """Stop the monitor."""
        self.monitor.stop()
