"""``verl-monitor prometheus-config --job NAME --targets HOST:PORT,...``: one job's scrape targets.

Writes the job's file_sd file (``DIR/NAME.json``, one entry per node with its ``job`` and
``node`` labels, written atomically) into the folder Prometheus reads (``targets/*.json`` in
``prometheus/prometheus.yml``), and with ``--config PATH`` a Prometheus config that reads that
folder with the shipped cadence (15 s scrape and evaluation), the rules, Alertmanager and the
runbook base URL. ``--remove`` deletes the job's file when the job ends, so its alerts resolve.
Bad input is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from exporters.options import DEFAULT_PORT

PROG = "verl-monitor prometheus-config"
#: Where the runbooks are browsable unless --runbook-base says otherwise.
DEFAULT_RUNBOOK_BASE = "https://github.com/verl-monitor/verl-monitor/blob/main/"
#: The shipped scrape and evaluation interval (prometheus/prometheus.yml).
SCRAPE_INTERVAL = "15s"
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ConfigInputError(ValueError):
    """Bad input; the message is one line saying what to change."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``prometheus-config`` subcommand."""
    p = subparsers.add_parser(
        "prometheus-config",
        help="write a job's Prometheus file_sd targets (and optionally a config that reads them)",
        description="Write DIR/JOB.json listing the job's exporters for Prometheus's file_sd "
        "(the shipped prometheus/prometheus.yml reads prometheus/targets/*.json), and with "
        "--config a Prometheus config for that folder. Example: verl-monitor prometheus-config "
        "--job grpo-qwen7b --targets gpu-01:9048,gpu-02:9048 --targets-dir prometheus/targets",
    )
    p.add_argument("--job", required=True, metavar="NAME",
                   help="the training job's name: the `job` label every rule groups by")
    p.add_argument("--targets", metavar="HOST[:PORT],...",
                   help="the job's exporters, comma- or space-separated (`scontrol show "
                   f"hostnames` output works); a host without a port gets {DEFAULT_PORT}")
    p.add_argument("--targets-dir", default="prometheus/targets", metavar="DIR",
                   help="the folder Prometheus's file_sd reads (default: prometheus/targets)")
    p.add_argument("--remove", action="store_true",
                   help="delete the job's targets file (the job ended: its alerts resolve)")
    p.add_argument("--config", metavar="PATH",
                   help="also write a Prometheus config reading --targets-dir")
    p.add_argument("--rules-dir", metavar="DIR",
                   help="the rule files' folder in --config (default: this repository's "
                   "prometheus/rules)")
    p.add_argument("--alertmanager", default="127.0.0.1:9093", metavar="HOST:PORT",
                   help="Alertmanager in --config (default: 127.0.0.1:9093)")
    p.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE, metavar="URL",
                   help="where docs/runbooks.md is browsable, ending in / (the alerts' "
                   f"runbook links; default {DEFAULT_RUNBOOK_BASE})")
    p.set_defaults(func=run)


def target_groups(job: str, targets: str | None) -> list[dict[str, Any]]:
    """file_sd entries for ``targets`` of ``job``; raises ConfigInputError on bad input."""
    from monitor.commands.run import RunError, file_sd_targets, parse_nodes

    if not _JOB_RE.match(job):
        raise ConfigInputError(f"--job {job!r}: use letters, digits, '.', '_' and '-' only")
    nodes = parse_nodes(targets)
    if not nodes:
        raise ConfigInputError("--targets: give the job's exporters, e.g. "
                               "gpu-01:9048,gpu-02:9048")
    try:
        return file_sd_targets(nodes, DEFAULT_PORT, job)
    except RunError as exc:
        raise ConfigInputError(f"--targets: {exc}") from None


def prometheus_config(targets_dir: Path, rules_dir: Path, alertmanager: str,
                      runbook_base: str) -> dict[str, Any]:
    """A Prometheus config (as a dict) that scrapes every job listed in ``targets_dir``."""
    if not re.match(r"^https?://\S+/$", runbook_base):
        raise ConfigInputError(f"--runbook-base {runbook_base!r}: expected an http(s) URL "
                               "ending in /")
    if not re.match(r"^[^\s:/]+:\d+$", alertmanager):
        raise ConfigInputError(f"--alertmanager {alertmanager!r}: expected HOST:PORT")
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL,
                   "scrape_timeout": "10s",
                   "external_labels": {"monitor": "verl-monitor",
                                       "runbook_base": runbook_base}},
        "rule_files": [str(rules_dir / "recording.yml"), str(rules_dir / "alerts.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{
            "job_name": "verl",
            "file_sd_configs": [{"files": [str(targets_dir / "*.json")],
                                 "refresh_interval": "30s"}],
            "relabel_configs": [{"source_labels": ["node", "__address__"], "separator": ";",
                                 "regex": ";([^:]+)(:[0-9]+)?", "target_label": "node",
                                 "replacement": "$1"}],
        }],
    }


def _default_rules_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "prometheus" / "rules"


def run(args: argparse.Namespace) -> int:
    """Write (or remove) the targets file and the config; 0, or 2 on bad input."""
    import yaml

    from monitor.commands.run import write_targets

    targets_dir = Path(args.targets_dir)
    path = targets_dir / f"{args.job}.json"
    try:
        if args.remove:
            if not _JOB_RE.match(args.job):
                raise ConfigInputError(f"--job {args.job!r}: use letters, digits, '.', '_' "
                                       "and '-' only")
            path.unlink(missing_ok=True)
            print(f"{PROG}: removed {path}")
            return 0
        groups = target_groups(args.job, args.targets)
        config = None
        if args.config:
            rules = Path(args.rules_dir) if args.rules_dir else _default_rules_dir()
            if not (rules / "alerts.yml").is_file():
                raise ConfigInputError(f"--rules-dir {rules}: has no alerts.yml")
            config = prometheus_config(targets_dir.resolve(), rules.resolve(),
                                       args.alertmanager, args.runbook_base)
        if targets_dir.exists() and not targets_dir.is_dir():
            raise ConfigInputError(f"--targets-dir {targets_dir}: is a file")
        write_targets(path, groups)
        print(f"{PROG}: {len(groups)} target(s) of job {args.job} written to {path}")
        if config is not None:
            Path(args.config).write_text(
                "# Written by verl-monitor prometheus-config; see prometheus/prometheus.yml.\n"
                + yaml.safe_dump(config, sort_keys=False))
            print(f"{PROG}: config written to {args.config} "
                  f"(prometheus --config.file={args.config})")
    except ConfigInputError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: cannot write {exc.filename or path}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return 0
