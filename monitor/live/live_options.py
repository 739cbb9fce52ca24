"""The live monitor's own options: what the window, the detectors, the store, Slack, wandb and
the derived views read, apart from the exporter's (listen address, collectors, GPU backends).

The exporter's command line still takes them all (``verl-monitor exporter --help``);
``ExporterOptions.live_options()`` hands the monitor this part, typed, once.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Default seconds between detector runs: ``run_all`` on a 30-minute window of 8 GPUs costs
#: about 0.4 s of CPU (bench/exporter.py), so every 30 s costs ~1.3% of a core; a new step in
#: the log also triggers a run (at most one a second), so step-based flags do not wait for it.
DEFAULT_DETECT_INTERVAL_S = 30.0


@dataclass(frozen=True)
class LiveOptions:
    """The monitor's settings (each is the ``verl-monitor exporter`` flag of the same name)."""

    interval: float = 1.0
    window: float = 1800.0
    config: str | None = None
    detect_interval: float | None = None
    store: str | None = None
    log: tuple[str, ...] = ()
    sim_log: str | None = None
    slack_webhook_file: str | None = None
    slack_digest_hours: float = 0.0
    wandb: str | None = None
    phase_source: str | None = None
    fr_dir: str | None = None
    fr_pipe_prefix: str = "pipe_"
    fr_dump_prefix: str = "fr_"
    hang_pyspy: bool | None = None  # None: on where py-spy is installed
    hang_job_pid: int | None = None  # --hang-job-pid: the job's root process on this node
    on_hang: str = "alert"  # alert | dump | terminate (monitor/live/hang_action.py)
    on_hang_after: float | None = None
    on_hang_grace: float | None = None
    on_hang_restack: float | None = None

    def effective_detect_interval(self) -> float:
        """``--detect-interval``, else the default (never below the sampling interval)."""
        if self.detect_interval is not None:
            return float(self.detect_interval)
        return max(float(self.interval), DEFAULT_DETECT_INTERVAL_S)
