"""Weights & Biases sink: the monitor's derived series and flags, logged to the user's wandb run.

What it logs (keys under ``verlmon/``, against its own x-axis ``verlmon/step`` so the trainer's
own ``step`` is left alone):

- per step: ``step_time_s``, ``throughput_tokens_per_s``, ``phase_s/<phase>``,
  ``phase_share/<phase>`` (of the step time), ``comm_share`` (when the log gives ``comm``);
- per step and phase, from :func:`monitor.analysis.attribution.attribute`: GPU activity
  ``gpu_util_pct/<phase>`` and ``sm_active_pct/<phase>`` (sample-weighted over every GPU),
  ``sm_active_min_gpu_pct/<phase>`` (the least busy GPU: a straggler shows here), and the same
  three for the whole step under ``.../step``;
- flags: ``flags_open/<severity>`` counts and a ``flags`` table (kind, severity, scope, start,
  end, state, evidence, advice); each warning or critical flag raises one ``run.alert``
  (WARN / ERROR), once per flag.

It never stops the monitor. ``wandb.init`` runs with a bounded ``init_timeout``; without an API
key (``WANDB_API_KEY``, ``wandb login``) or when the service cannot be reached it logs offline
(``wandb sync <dir>`` uploads later), saying so in one line; if wandb is missing or fails
entirely it says so in one line and disables itself (``errors`` counts the failures).

How the lead wires ``--wandb PROJECT[/RUN_ID]`` (exporter and ``analyze``)::

    from monitor.integrations.wandb_sink import WandbSink

    # "proj", "proj/run_id", "entity/proj/run_id" or a run URL; ValueError (in words) otherwise
    sink = WandbSink.from_target(args.wandb)

    # exporter, in ExporterApp.detect_once(), after `opened, closed = self.tracker.update(...)`
    # (steps and gpu_df are the window frames it just read; one call logs the steps not yet
    # logged, with their per-phase GPU activity, then the flag changes and alerts):
    sink.log_window(steps, gpu_df, opened, closed)
    # ... and on shutdown (bounded by finish_timeout):
    sink.close()

    # analyze --wandb, after run_all and attribute:
    with WandbSink.from_target(args.wandb) as sink:
        sink.log_analysis(steps, flags, attribute(steps, gpu) if gpu is not None else None)

The per-step goodput shares come from the ledger under the sink's ``config`` and ``job_config``
(the job's printed config: ``analyze`` gives the one it read, the exporter its
``JobConfigWatch.config``, asked at each call until found), so a V1 separate-async run whose keys
read as sync books ``gen`` as waiting for samples here as in ``analyze``.

The lower-level calls are ``log_step(step_record, attribution_rows)`` (rows of
``attribute(...)``; only those of that step are used) and ``log_flags(opened, closed)``.

``mode`` is ``online`` (default, or ``WANDB_MODE``), ``offline``, ``shared`` (wandb's mode for
writing to a run another process is writing to) or ``disabled``. With a run id the run is
resumed (``resume="allow"``) and its final state is left to its owner.
"""

from __future__ import annotations

import logging
import math
import netrc
import os
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import pandas as pd

from monitor.analysis.attribution import attribute, phase_summary
from monitor.numbers import finite_float as _num
from monitor.printable import printable
from monitor.records import Flag, StepRecord

log = logging.getLogger("verl_monitor.wandb")

#: Default wandb project when ``--wandb`` names none.
DEFAULT_PROJECT = "verl-monitor"
#: Prefix of every key this sink logs.
PREFIX = "verlmon/"
#: Consecutive failed calls after which the sink gives up.
MAX_CONSECUTIVE_ERRORS = 3
#: Steps remembered by ``log_window`` so that each is logged once.
MAX_REMEMBERED_STEPS = 10_000
PHASE_COLUMNS = ["phase", "node", "gpu", "util_mean", "sm_mean", "util_p10", "sm_p10", "steps",
                 "samples"]
FLAG_COLUMNS = ["kind", "severity", "scope", "start", "end", "state", "evidence", "advice"]
_ALERT_LEVEL = {"warning": "WARN", "critical": "ERROR"}
_URL = re.compile(r"https?://[^/]+/(?P<entity>[^/]+)/(?P<project>[^/]+)/runs/(?P<run>[^/?#]+)")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_wandb_target(text: str) -> tuple[str | None, str, str | None]:
    """Split ``--wandb`` into (entity, project, run_id).

    Accepts ``PROJECT``, ``PROJECT/RUN_ID``, ``ENTITY/PROJECT/RUN_ID`` or a run's URL
    (``https://wandb.ai/ENTITY/PROJECT/runs/RUN_ID``). Raises ValueError in words otherwise.
    """
    text = (text or "").strip()
    m = _URL.match(text)
    if m:
        return m["entity"], m["project"], m["run"]
    parts = text.split("/")
    if not text or len(parts) > 3 or not all(_NAME.match(p) for p in parts):
        raise ValueError(
            f"--wandb {text!r}: expected PROJECT, PROJECT/RUN_ID, ENTITY/PROJECT/RUN_ID or a "
            "run URL (letters, digits, '_', '-', '.')"
        )
    if len(parts) == 1:
        return None, parts[0], None
    if len(parts) == 2:
        return None, parts[0], parts[1]
    return parts[0], parts[1], parts[2]


def _rows(attribution_rows: Any) -> list[Mapping[str, Any]]:
    """Attribution rows as dicts, from a DataFrame or an iterable of mappings."""
    if attribution_rows is None:
        return []
    if hasattr(attribution_rows, "to_dict"):
        return list(attribution_rows.to_dict("records"))
    return [dict(r) for r in attribution_rows]


def _activity(rows: list[Mapping[str, Any]]) -> dict[str, float]:
    """Sample-weighted util and SM activity over the GPUs of ``rows``, and the least busy GPU."""
    out: dict[str, float] = {}
    for col, key in (("util_mean", "gpu_util_pct"), ("sm_mean", "sm_active_pct")):
        pairs = [(_num(r.get(col)), _num(r.get("samples")) or 1.0) for r in rows]
        pairs = [(v, w) for v, w in pairs if v is not None]
        if pairs:
            out[key] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    per_gpu: dict[tuple[str, Any], list[tuple[float, float]]] = {}
    for r in rows:
        v = _num(r.get("sm_mean"))
        if v is not None:
            per_gpu.setdefault((str(r.get("node")), r.get("gpu")), []).append(
                (v, _num(r.get("samples")) or 1.0))
    if per_gpu:
        out["sm_active_min_gpu_pct"] = min(
            sum(v * w for v, w in vals) / sum(w for _, w in vals) for vals in per_gpu.values())
    return out


def step_payload(
    rec: StepRecord, attribution_rows: Any = None, extra: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """The values :meth:`WandbSink.log_step` logs for one step (pure; no wandb needed).

    ``attribution_rows`` are :func:`~monitor.analysis.attribution.attribute` rows; only those of
    ``rec.step`` are used. ``extra`` adds more numbers under the prefix (e.g. the NCCL share).
    """
    out: dict[str, float] = {PREFIX + "step": float(rec.step)}
    total = _num(rec.total)
    if total is not None:
        out[PREFIX + "step_time_s"] = total
    tput = _num(rec.throughput)
    if tput is not None:
        out[PREFIX + "throughput_tokens_per_s"] = tput
    for phase, seconds in rec.phases.items():
        sec = _num(seconds)
        if sec is None:
            continue
        out[f"{PREFIX}phase_s/{phase}"] = sec
        if total:
            out[f"{PREFIX}phase_share/{phase}"] = sec / total
    comm = _num(rec.phases.get("comm"))
    if comm is not None and total:
        out[PREFIX + "comm_share"] = min(1.0, comm / total)
    rows = [r for r in _rows(attribution_rows) if _num(r.get("step")) == float(rec.step)]
    by_phase: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_phase.setdefault(str(r.get("phase")), []).append(r)
    for phase, phase_rows in [*by_phase.items(), ("step", rows)]:
        if not phase_rows:
            continue
        for key, value in _activity(phase_rows).items():
            out[f"{PREFIX}{key}/{phase}"] = value
    for key, value in (extra or {}).items():
        v = _num(value)
        if v is not None:
            out[PREFIX + key] = v
    return out


def goodput_shares(led: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per step: each cause's share of the step's GPU-seconds, from a goodput ledger
    (:func:`monitor.analysis.goodput.ledger`), as ``{step: {"goodput/<cause>": share}}``."""
    from monitor.analysis.goodput import CAUSES

    if led is None or len(led) == 0:
        return {}
    rows = led[~led["tail"].astype(bool)] if "tail" in led.columns else led
    per = rows.groupby("step")[["wall", *CAUSES]].sum()
    out: dict[int, dict[str, float]] = {}
    for step, r in per.iterrows():
        wall = float(r["wall"])
        if wall > 0:
            out[int(step)] = {f"goodput/{c}": float(r[c]) / wall for c in CAUSES}
    return out


#: The job's printed config as a sink is given it: the config, a function that gives it once
#: known (the live monitor's ``JobConfigWatch.config``), or None (none).
JobConfigArg = Mapping[str, Any] | Callable[[], Mapping[str, Any] | None] | None


def _analysis(steps: list[StepRecord], gpu_samples: Any, config: Any,
              flags: list[Flag], job_config: Mapping[str, Any] | None = None) -> Any:
    """The run's :class:`~monitor.analysis.run_analysis.RunAnalysis` under the sink's config
    (the exporter's ``--config``, or ``analyze``'s) and the job's printed config, with the
    flags already known."""
    from monitor.analysis.run_analysis import RunAnalysis

    return RunAnalysis(steps, gpu_samples, config=config, flags=flags, job_config=job_config)


def _ledger_shares(ra: Any) -> dict[int, dict[str, float]]:
    """Goodput shares per step of an analysis; {} when they cannot be computed."""
    if not ra.has_gpu or not ra.steps:
        return {}
    try:
        return goodput_shares(ra.ledger())
    except Exception as exc:  # the ledger is extra: log the steps regardless
        log.debug("wandb: goodput ledger failed: %s", exc)
        return {}


def top_problem_summary(ra: Any) -> dict[str, Any]:
    """The run summary's ``top_problem`` keys: the flag that costs the most GPU time
    (``RunAnalysis.top_problem``); {} without one or without GPU samples."""
    try:
        top = ra.top_problem() if ra.has_gpu else None
    except Exception as exc:  # extra: never stops the logging
        log.debug("wandb: top problem failed: %s", exc)
        return {}
    if top is None:
        return {}
    out: dict[str, Any] = {PREFIX + "top_problem": top["kind"],
                           PREFIX + "top_problem_severity": top["severity"]}
    if top.get("gpu_seconds") is not None:
        out[PREFIX + "top_problem_gpu_seconds"] = float(top["gpu_seconds"])
        out[PREFIX + "top_problem_share"] = top.get("share")
    return out


def headline_summary(ra: Any, flags: Iterable[Flag], n_steps: int | None) -> dict[str, Any]:
    """The run summary's headline keys, as the Overview's banner and ``analyze`` say it
    (``monitor.analysis.headline``): ``state``, ``headline`` (the banner's words), ``goodput``,
    ``top_loss`` and its ``top_loss_share``, over the last ``n_steps`` steps (the run with
    None); {} without GPU samples."""
    from monitor.analysis.headline import cause_seconds, headline, last_steps

    try:
        led = ra.ledger() if ra.has_gpu else None
    except Exception as exc:  # extra: never stops the logging
        log.debug("wandb: headline failed: %s", exc)
        return {}
    if led is None or not len(led):
        return {}
    span = "the run" if n_steps is None else f"the last {n_steps} steps"
    rows = led[~led["tail"].astype(bool)] if n_steps is None else last_steps(led, n_steps)
    head = headline(cause_seconds(rows), [f for f in flags if f.end is None], span=span,
                    suppress=ra.config.section("suppress"))
    out: dict[str, Any] = {PREFIX + "state": head.state, PREFIX + "headline": head.text}
    if head.goodput is not None:
        out[PREFIX + "goodput"] = round(head.goodput, 4)
    if head.top_loss is not None:
        out[PREFIX + "top_loss"] = head.top_loss
        out[PREFIX + "top_loss_share"] = round(float(head.top_loss_share or 0.0), 4)
    return out


def _flag_id(flag: Flag) -> tuple[str, str, float]:
    return (flag.kind, flag.scope_label, float(flag.start))


def _alert_text(flag: Flag) -> str:
    lines = [flag.evidence or f"{flag.kind} detected"]
    if flag.scope_label:
        lines.append(f"Scope: {flag.scope_label}")
    lines += [f"- {a}" for a in flag.advice]
    return printable("\n".join(lines))  # log text inert in wandb's pages and e-mails


class WandbSink:
    """Logs derived series and flags to a wandb run; never raises, never blocks unboundedly.

    ``project`` defaults to "verl-monitor"; ``run_id`` resumes that run (``resume="allow"``),
    otherwise a new run is created in the project. ``mode`` overrides ``WANDB_MODE``
    (online/offline/shared/disabled); ``wandb_dir`` is where wandb keeps its files (default
    ``WANDB_DIR`` or the working directory). ``config`` is the whole ``Config`` the ledger runs
    under, ``job_config`` the job's printed config or a function giving it once known (see
    :data:`JobConfigArg`). After construction, ``mode`` holds the mode actually used
    (None when disabled), ``enabled`` whether it logs, ``errors`` how many wandb calls failed.
    """

    def __init__(
        self,
        project: str | None,
        run_id: str | None,
        *,
        mode: str | None = None,
        entity: str | None = None,
        init_timeout: float = 20.0,
        finish_timeout: float = 30.0,
        wandb_dir: str | os.PathLike[str] | None = None,
        config: Any = None,
        job_config: JobConfigArg = None,
    ) -> None:
        #: the whole ``Config`` the ledger runs under (the exporter's ``--config``, or
        #: ``analyze``'s); None: the packaged defaults
        self.config = config
        self._job_config = job_config
        self.project = project or DEFAULT_PROJECT
        self.run_id = run_id
        self.entity = entity
        self.init_timeout = float(init_timeout)
        self.finish_timeout = float(finish_timeout)
        # WANDB_DIR is read here, for each sink: wandb itself caches its settings once per
        # process, so a later change of WANDB_DIR would otherwise be ignored.
        if wandb_dir is None:
            wandb_dir = os.environ.get("WANDB_DIR") or None
        self.wandb_dir = None if wandb_dir is None else os.fspath(wandb_dir)
        self.requested_mode = (mode or os.environ.get("WANDB_MODE") or "online").lower()
        self.mode: str | None = None
        self.run: Any = None
        self.errors = 0
        self._consecutive = 0
        self._wandb: Any = None
        self._flags: list[Flag] = []  # every flag seen, latest state, in order of opening
        self._open: dict[tuple[str, str], int] = {}  # (kind, scope) -> index in _flags
        self._alerted: set[tuple[str, str, float, str]] = set()
        #: run.alert outcomes: sent, failed (the call raised), dropped (no run to alert on)
        self.alerts = {"sent": 0, "failed": 0, "dropped": 0}
        self._opened_total = 0
        self._logged_steps: dict[tuple[int, float | None], None] = {}
        self._start()

    @classmethod
    def from_target(cls, target: str, *, mode: str | None = None, **kwargs: Any) -> WandbSink:
        """A sink for ``--wandb PROJECT[/RUN_ID]`` (see :func:`parse_wandb_target`)."""
        entity, project, run_id = parse_wandb_target(target)
        return cls(project, run_id, mode=mode, entity=entity, **kwargs)

    @property
    def job_config(self) -> Mapping[str, Any] | None:
        """The job's printed config the ledger is told (None while none is known)."""
        given = self._job_config
        return given() if callable(given) else given

    # ------------------------------------------------------------------------- lifecycle

    @property
    def enabled(self) -> bool:
        """True while the sink has a run to log to."""
        return self.run is not None

    def _disable(self, why: str) -> None:
        self.errors += 1
        self.run = None
        log.warning("wandb: %s; wandb logging is off for this run", why)

    def _start(self) -> None:
        if self.requested_mode == "disabled":
            log.info("wandb: disabled (mode=disabled)")
            return
        try:
            import wandb
        except ImportError:
            self._disable("the wandb package is not installed "
                          "(the 'wandb' extra: pip install 'verl-monitor[wandb]')")
            return
        except Exception as exc:  # a broken install must not stop the monitor
            self._disable(f"wandb cannot be imported ({type(exc).__name__}: {exc})")
            return
        self._wandb = wandb
        want = self.requested_mode
        if want not in ("online", "shared", "offline", "dryrun"):
            self._disable(f"unknown mode {want!r} (use online, offline, shared or disabled)")
            return
        reason = ""
        if want in ("online", "shared"):
            if not self._has_credentials():
                reason = "no API key (set WANDB_API_KEY or run `wandb login`)"
            else:
                failure = self._init(want)
                if failure is None:
                    return
                reason = f"{want} start failed ({failure})"
                self._reset()  # the failed start keeps the run id "in use" otherwise
        failure = self._init("offline")
        if failure is not None:
            self._disable(f"{reason + ', and ' if reason else ''}offline start failed ({failure})")
        elif reason:
            folder = os.path.dirname(str(self.run.dir).rstrip("/"))
            log.warning("wandb: %s; logging offline to %s (upload later: wandb sync %s)",
                        reason, folder, folder)

    def _reset(self) -> None:
        try:
            self._wandb.teardown()
        except Exception as exc:
            log.debug("wandb teardown after a failed start: %s", exc)

    def _has_credentials(self) -> bool:
        """An API key in WANDB_API_KEY, an identity token file, or a netrc entry for the server.

        Checked here rather than with ``wandb.login``, which can take seconds without a network
        and prompts in a terminal.
        """
        if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
            return True
        try:
            host = urlparse(str(self._wandb.Settings().base_url)).hostname
        except Exception:
            host = None
        if not host:
            return False
        if os.environ.get("NETRC"):
            paths = [os.environ["NETRC"]]
        else:
            paths = [os.path.expanduser("~/.netrc"), os.path.expanduser("~/_netrc")]
        for path in paths:
            try:
                auth = netrc.netrc(path).authenticators(host)
            except (OSError, netrc.NetrcParseError):
                continue
            if auth and auth[2]:
                return True
        return False

    def _init(self, mode: str) -> str | None:
        """Start the run in ``mode``; None on success, else the failure in a few words."""
        wandb = self._wandb
        settings: dict[str, Any] = {
            "init_timeout": self.init_timeout,
            "finish_timeout": self.finish_timeout,
            "silent": True,
            "console": "off",
            "x_disable_stats": True,  # the monitor measures the GPUs itself
            "x_label": "verl-monitor",
            "disable_git": True,
            "save_code": False,
        }
        if self.run_id:
            settings["x_update_finish_state"] = False  # the run's owner decides its end state
        kwargs: dict[str, Any] = {
            "project": self.project,
            "entity": self.entity,
            "mode": mode,
            "settings": wandb.Settings(**settings),
            "reinit": "create_new",
        }
        if self.wandb_dir is not None:
            kwargs["dir"] = self.wandb_dir
        if self.run_id:
            kwargs.update(id=self.run_id, resume="allow")
        if mode == "shared":
            kwargs.pop("resume", None)
        else:
            kwargs["job_type"] = None if self.run_id else "verl-monitor"
        try:
            run = wandb.init(**kwargs)
            run.define_metric(PREFIX + "step")
            run.define_metric(PREFIX + "*", step_metric=PREFIX + "step")
        except Exception as exc:
            self.errors += 1
            text = str(exc).strip()
            return (text.splitlines()[0] if text else type(exc).__name__)[:200]
        self.run = run
        self.mode = mode
        return None

    def close(self) -> None:
        """Finish the run (bounded by ``finish_timeout``); the sink is disabled afterwards."""
        run, self.run = self.run, None
        if run is None:
            return
        try:
            run.finish()
        except Exception as exc:
            self.errors += 1
            log.warning("wandb: finishing the run failed (%s)", exc)

    def __enter__(self) -> WandbSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- logging

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> bool:
        if self.run is None:
            return False
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            self.errors += 1
            self._consecutive += 1
            if self._consecutive >= MAX_CONSECUTIVE_ERRORS:
                self._disable(f"{self._consecutive} failed calls in a row (last: {what}: {exc})")
            elif self._consecutive == 1:
                log.warning("wandb: %s failed (%s)", what, exc)
            return False
        self._consecutive = 0
        return True

    def log_step(
        self,
        step_record: StepRecord,
        attribution_rows: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, float]:
        """Log one step's derived series (see :func:`step_payload`); returns what was logged."""
        payload = step_payload(step_record, attribution_rows, extra)
        if self.run is not None:
            self._call("log", self.run.log, payload)
        return payload

    def log_flags(self, opened: Iterable[Flag], closed: Iterable[Flag]) -> None:
        """Record flags opened and closed (FlagTracker.update's result): counts, table, alerts."""
        opened, closed = list(opened), list(closed)
        if not opened and not closed:
            return
        for flag in opened:
            self._open[(flag.kind, flag.scope_label)] = len(self._flags)
            self._flags.append(flag)
            self._opened_total += 1
        for flag in closed:
            at = self._open.pop((flag.kind, flag.scope_label), None)
            if at is None:
                self._flags.append(flag)
            else:
                self._flags[at] = flag
        self._log_flag_state(opened)

    def _log_flag_state(self, to_alert: list[Flag]) -> None:
        if self.run is None:
            self.alerts["dropped"] += sum(1 for f in to_alert if f.severity in _ALERT_LEVEL)
            return
        counts = {f"{PREFIX}flags_open/{sev}": 0 for sev in ("info", "warning", "critical")}
        for at in self._open.values():
            key = f"{PREFIX}flags_open/{self._flags[at].severity}"
            counts[key] = counts.get(key, 0) + 1
        counts[PREFIX + "flags_opened_total"] = self._opened_total
        payload: dict[str, Any] = dict(counts)
        table = self._table()
        if table is not None:
            payload[PREFIX + "flags"] = table
        self._call("log", self.run.log, payload)
        for flag in to_alert:
            self._alert(flag)

    def _table(self) -> Any:
        try:
            rows = []
            still_open = set(self._open.values())
            for at, flag in enumerate(self._flags):
                state = "open" if at in still_open else "closed"
                rows.append([flag.kind, flag.severity, printable(flag.scope_label),
                             float(flag.start), None if flag.end is None else float(flag.end),
                             state, printable(flag.evidence), printable("\n".join(flag.advice))])
            return self._wandb.Table(columns=FLAG_COLUMNS, data=rows)
        except Exception as exc:
            self.errors += 1
            log.warning("wandb: building the flags table failed (%s)", exc)
            return None

    def _alert(self, flag: Flag) -> None:
        level = _ALERT_LEVEL.get(flag.severity)
        key = (*_flag_id(flag), flag.severity)
        if level is None or key in self._alerted:
            return
        if self.run is None:  # the sink turned itself off: the alert cannot go
            self.alerts["dropped"] += 1
            return
        self._alerted.add(key)
        title = f"verl-monitor: {flag.kind} ({flag.severity})"
        if flag.scope_label:
            title += f" {flag.scope_label}"
        ok = self._call("alert", self.run.alert, title=title[:200],
                        text=_alert_text(flag)[:4000], level=level,
                        wait_duration=timedelta(seconds=1))
        self.alerts["sent" if ok else "failed"] += 1

    def log_window(
        self,
        steps: Iterable[StepRecord],
        gpu_samples: Any = None,
        opened: Iterable[Flag] = (),
        closed: Iterable[Flag] = (),
    ) -> int:
        """The exporter's one call per detector run: log the steps not logged yet, then flags.

        ``steps`` and ``gpu_samples`` are the rolling window's (``RollingWindow.frames()``);
        each new step gets its per-phase GPU activity from ``attribute``. ``opened`` and
        ``closed`` are ``FlagTracker.update``'s result. Returns how many steps were logged.
        """
        steps = list(steps)
        new = [r for r in steps if (r.step, r.end_time) not in self._logged_steps]
        if new:
            rows: Any = None
            if gpu_samples is not None and len(gpu_samples):
                try:
                    rows = attribute(new, gpu_samples)
                except Exception as exc:  # attribution is extra: log the steps regardless
                    log.debug("wandb: attribution failed: %s", exc)
            # the window's steps give each new step its predecessor (its wall time starts there)
            # every flag seen covers its steps, open or closed since (a long tail's steps
            # book generation's loss as the tail, as analyze and the dashboard do)
            opened, closed = list(opened), list(closed)
            seen = {_flag_id(f): f for f in [*self._flags, *opened, *closed]}
            ra = _analysis(steps, gpu_samples, self.config, list(seen.values()),
                           self.job_config)
            shares = _ledger_shares(ra)
            for rec in sorted(new, key=lambda r: (r.end_time or 0.0, r.step)):
                self.log_step(rec, rows, shares.get(int(rec.step)))
                self._logged_steps[(rec.step, rec.end_time)] = None
            while len(self._logged_steps) > MAX_REMEMBERED_STEPS:
                self._logged_steps.pop(next(iter(self._logged_steps)))
            top = top_problem_summary(ra)
            from monitor.analysis.headline import SPAN_STEPS

            top.update(headline_summary(ra, seen.values(), SPAN_STEPS))
            if top and self.run is not None:
                self._call("summary", self.run.summary.update, top)
        self.log_flags(opened, closed)
        return len(new)

    def log_attempts(self, ledger: Mapping[str, Any]) -> dict[str, float]:
        """The ledger across the job's attempts (``monitor.analysis.attempts.job_ledger``):
        ``job/ettr``, ``job/wall_s``, ``job/attempts``, ``job/failures``,
        ``job/steps_redone``, ``job/checkpoint_saves`` and ``job/seconds/<bucket>`` logged and
        in the run summary, the attempts as the ``attempts`` table. Returns what was logged."""
        from monitor.analysis.attempts import ATTEMPT_COLUMNS, attempt_rows, ledger_numbers

        numbers = {f"{PREFIX}job/{k}": v for k, v in ledger_numbers(dict(ledger)).items()}
        if self.run is None:
            return numbers
        self._call("summary", self.run.summary.update, dict(numbers))
        payload: dict[str, Any] = dict(numbers)
        try:
            payload[PREFIX + "attempts"] = self._wandb.Table(columns=ATTEMPT_COLUMNS,
                                                             data=attempt_rows(dict(ledger)))
        except Exception as exc:
            self.errors += 1
            log.warning("wandb: building the attempts table failed (%s)", exc)
        self._call("log", self.run.log, payload)
        return numbers

    def log_analysis(self, steps: Iterable[StepRecord], flags: Iterable[Flag],
                     attribution: Any = None, gpu_samples: Any = None) -> None:
        """``analyze --wandb``: every step's series, the flags (table, counts, alerts), and the
        per-phase GPU activity as a table and in the run summary.

        ``attribution`` is ``attribute(steps, gpu)`` (per-step rows, logged with each step) or
        its ``phase_summary`` (rows without ``step``); None when there is no GPU telemetry.
        """
        rows = _rows(attribution)
        per_step = [r for r in rows if _num(r.get("step")) is not None]
        by_step: dict[float, list[Mapping[str, Any]]] = {}
        for r in per_step:
            by_step.setdefault(float(r["step"]), []).append(r)
        steps = list(steps)
        flags = list(flags)
        ra = _analysis(steps, gpu_samples, self.config, flags, self.job_config)
        shares = _ledger_shares(ra)
        for rec in sorted(steps, key=lambda r: r.step):
            self.log_step(rec, by_step.get(float(rec.step), []), shares.get(int(rec.step)))
        flags = sorted(flags, key=lambda f: f.start)
        base = len(self._flags)
        self._flags.extend(flags)
        self._opened_total += len(flags)
        for at, flag in enumerate(flags, start=base):
            if flag.end is None:
                self._open[(flag.kind, flag.scope_label)] = at
        self._log_flag_state(flags)
        if self.run is None:
            return
        summary: dict[str, Any] = {
            f"{PREFIX}flags/{sev}": sum(1 for f in flags if f.severity == sev)
            for sev in ("info", "warning", "critical")}
        summary.update(top_problem_summary(ra))
        summary.update(headline_summary(ra, flags, None))
        phase_rows = rows
        if per_step:
            phase_rows = phase_summary(pd.DataFrame(per_step)).to_dict("records")
        by_phase: dict[str, list[Mapping[str, Any]]] = {}
        for r in phase_rows:
            by_phase.setdefault(str(r.get("phase")), []).append(r)
        for phase, prow in by_phase.items():
            for key, value in _activity(prow).items():
                summary[f"{PREFIX}{key}/{phase}"] = value
        self._call("summary", self.run.summary.update, summary)
        if phase_rows:
            try:
                table = self._wandb.Table(columns=PHASE_COLUMNS, data=[
                    [r.get(c) if not isinstance(r.get(c), float) or math.isfinite(r.get(c))
                     else None for c in PHASE_COLUMNS] for r in phase_rows])
            except Exception as exc:
                self.errors += 1
                log.warning("wandb: building the phase table failed (%s)", exc)
                return
            self._call("log", self.run.log, {PREFIX + "phase_activity": table})
