"""The core's one face: what the packages beside it (``dashboards/``, ``exporters/``) import.

As ``nvitop.api`` serves ``nvitop-exporter``, this module names the public types and functions
of ``monitor``: records, frames, the config, the run analysis, the detectors' entry point, the
run store and the log parser and follower. Modules outside ``monitor/`` import from here, not
from the core's inner modules (``tests/test_api.py`` checks ``dashboards/``), so the core can
move things inside itself without touching its readers. Importing it needs the core install
only: no extra is imported at the top of any module it names.
"""

from __future__ import annotations

from monitor import __version__, metric_names
from monitor.analysis.attempts import BUCKET_TEXT, BUCKETS, job_ledger
from monitor.analysis.attribution import (
    default_min_phase_samples,
    label_samples,
    phase_timeline,
    sample_period,
)
from monitor.analysis.cadence import cadence
from monitor.analysis.goodput import (
    CAUSE_TEXT,
    CAUSES,
    LOST_CAUSES,
    cause_line,
    distinct_steps,
    totals,
)
from monitor.analysis.headline import (
    SPAN_STEPS,
    Headline,
    RunEnd,
    cause_seconds,
    headline,
    last_steps,
    rank_open,
)
from monitor.analysis.run_analysis import FLAG_CAUSES, RunAnalysis, config_of, rank_problems
from monitor.analysis.summary import phase_table
from monitor.config import Config, ConfigError, load_config
from monitor.detect import run_all
from monitor.detect.flag_advice import advice_for
from monitor.detect.memory import theil_sen
from monitor.downsample import MAX_ENVELOPE, MIN_ENVELOPE, bucket_seconds, downsample
from monitor.extras import explain_missing, missing_extra_message
from monitor.frames import GPU_COLUMNS, HOST_COLUMNS, nccl_frame, rollout_frame
from monitor.hang.where import describe_where
from monitor.logs.canonical_records import LogParser, parse_file
from monitor.logs.follow import LogFollower, LogPosition
from monitor.printable import printable
from monitor.records import ALL_PHASES, FLAG_KINDS, SEVERITIES, Event, Flag, StepRecord
from monitor.store import RunStore, StoreError, StoreWriter
from monitor.store.job_history import job_history
from monitor.urls import UrlError, redact, split_url

__all__ = [
    "printable",
    "ALL_PHASES",
    "BUCKETS",
    "BUCKET_TEXT",
    "CAUSES",
    "CAUSE_TEXT",
    "FLAG_CAUSES",
    "FLAG_KINDS",
    "GPU_COLUMNS",
    "HOST_COLUMNS",
    "LOST_CAUSES",
    "MAX_ENVELOPE",
    "MIN_ENVELOPE",
    "SEVERITIES",
    "SPAN_STEPS",
    "Config",
    "ConfigError",
    "Event",
    "Flag",
    "Headline",
    "LogFollower",
    "LogParser",
    "LogPosition",
    "RunAnalysis",
    "RunEnd",
    "RunStore",
    "StepRecord",
    "StoreError",
    "StoreWriter",
    "UrlError",
    "__version__",
    "advice_for",
    "bucket_seconds",
    "cadence",
    "cause_line",
    "cause_seconds",
    "config_of",
    "default_min_phase_samples",
    "describe_where",
    "distinct_steps",
    "downsample",
    "explain_missing",
    "headline",
    "job_history",
    "job_ledger",
    "label_samples",
    "last_steps",
    "load_config",
    "metric_names",
    "missing_extra_message",
    "nccl_frame",
    "parse_file",
    "phase_table",
    "phase_timeline",
    "rank_open",
    "rank_problems",
    "redact",
    "rollout_frame",
    "run_all",
    "sample_period",
    "split_url",
    "theil_sen",
    "totals",
]
