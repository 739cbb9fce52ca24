"""The live wing: the monitor's runtime inside the exporter process.

Collectors publish into a :class:`Sink` (sink.py); the :class:`LiveMonitor`
(live_monitor.py) keeps them in the :class:`RollingWindow` (rolling_window.py), runs the
detectors on it, tracks the flags (flag_tracker.py), writes the store and posts to Slack and
wandb (alert_paths.py counts each path). The exporter (exporters/) imports this package only
through the names below.
"""

from monitor.live.live_monitor import LiveMonitor, MonitorError
from monitor.live.rolling_window import RollingWindow
from monitor.live.sink import NullSink, Row, Sink

__all__ = ["LiveMonitor", "MonitorError", "NullSink", "RollingWindow", "Row", "Sink"]
