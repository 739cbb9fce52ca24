"""The live wing: the monitor's runtime inside the exporter process.

Collectors publish into a :class:`Sink` (sink.py); the :class:`LiveMonitor`
(live_monitor.py) keeps them in the :class:`RollingWindow` (rolling_window.py), runs the
detectors on it, tracks the flags (flag_tracker.py), writes the store and posts to Slack and
wandb (alert_paths.py counts each path). The derived views (live_view.py: the flag series,
per-phase GPU time, goodput, hang dumps) read the window and the tracker back and answer ``collect()``;
``VIEWS`` lists them for the exporter, which serves them beside its collectors. The exporter
(exporters/) imports this package only through the names below.
"""

from monitor.live.attempt_counter import AttemptsView
from monitor.live.flag_series import FlagsCollector
from monitor.live.goodput_counter import GoodputCollector
from monitor.live.hang_action import HangActionView
from monitor.live.hang_action import add_flags as hang_action_flags
from monitor.live.hang_dumps import FlightRecorderCollector
from monitor.live.hang_dumps import add_flags as hang_dump_flags
from monitor.live.health_registry import HealthRegistry, labelled_counter
from monitor.live.live_monitor import LiveMonitor, MonitorError
from monitor.live.live_view import AddFlags, FlagGroup, LiveView, PollingView, ViewContext, ViewSpec
from monitor.live.phase_gpu_counter import PhaseGpuCollector
from monitor.live.phase_gpu_counter import add_flags as phase_gpu_flags
from monitor.live.rolling_window import RollingWindow
from monitor.live.sink import NullSink, Row, Sink

#: The derived views, in the order /metrics lists them (each gets ``--collector.NAME``; a view
#: with flags of its own declares them beside it: ``flags=``, shown in its own --help group).
VIEWS: tuple[ViewSpec, ...] = (
    ViewSpec("flags", FlagsCollector,
             "detector flags: open flags by kind, severity, node, GPU "
             "and phase with their evidence and advice, and flags raised so far"),
    ViewSpec("phase_gpu", PhaseGpuCollector,
             "per-phase GPU activity counters: the driver's phase timeline (own log, or "
             "--phase-source) joined with this node's GPU samples", flags=phase_gpu_flags),
    ViewSpec("goodput", GoodputCollector,
             "goodput ledger: GPU-seconds of each step by cause (productive, data_loading, "
             "rollout_long_tail, straggler_wait, ...) per GPU, from the verl log and GPU samples"),
    ViewSpec("flight_recorder", FlightRecorderCollector,
             "when the log falls silent: py-spy stacks of the job's local processes (on by "
             "default where py-spy is installed) saying where each is, and Flight Recorder "
             "dumps of the local ranks (--fr-dir) naming the rank the others wait for",
             flags=hang_dump_flags),
    ViewSpec("attempts", AttemptsView,
             "the job across its attempts: each start and exit of verl-monitor run kept in "
             "the store, the job's wall seconds by bucket, steps redone, checkpoint saves, "
             "failures and ETTR, from the whole run store"),
    ViewSpec("hang_action", HangActionView,
             "what to do on a critical hang (--on-hang): alert, dump the evidence into the "
             "store, or terminate the job's process tree under verl-monitor run",
             flags=hang_action_flags),
)

__all__ = ["VIEWS", "AddFlags", "FlagGroup", "HealthRegistry", "LiveMonitor", "LiveView",
           "MonitorError", "NullSink", "PollingView", "RollingWindow", "Row", "Sink", "ViewContext",
           "ViewSpec", "labelled_counter"]
