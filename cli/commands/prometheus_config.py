"""``verl-monitor prometheus-config --job NAME --targets HOST:PORT,...``: one job's scrape targets.

Writes the job's file_sd file (``DIR/NAME.json``, one entry per exporter with its ``job`` and
``node`` labels, written atomically) into the folder Prometheus reads (``targets/*.json`` in
``prometheus/prometheus.yml``), and with ``--config PATH`` a Prometheus config that reads that
folder with the shipped cadence (15 s scrape and evaluation), the rules, Alertmanager and the
runbook base URL. ``--remove`` deletes the job's file when the job ends, so its alerts resolve.
Bad input is one line and exit status 2.

Each target's ``node`` label is the name its exporter goes by (its ``--node``, which every
series it sends carries), so the pages, the rules and the exporter agree on it: ``NODE=HOST:PORT``
names it; otherwise the exporter is asked (``verlmon_node_info`` on its /metrics, a few
seconds at most, all targets at once); an exporter that does not answer yet is named after its
host, or ``HOST:PORT`` where two of the job's exporters share a host (two exporters on one host
stay two nodes).
"""

from __future__ import annotations

import argparse
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cli.errors import CommandError, exits
from exporters.options import DEFAULT_PORT
from monitor.urls import redact, split_url

PROG = "verl-monitor prometheus-config"
#: Where the runbooks are browsable unless --runbook-base says otherwise.
DEFAULT_RUNBOOK_BASE = "https://github.com/verl-monitor/verl-monitor/blob/main/"
#: The shipped scrape and evaluation interval (prometheus/prometheus.yml).
SCRAPE_INTERVAL = "15s"
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Seconds an exporter has to say its node name.
ASK_TIMEOUT_S = 3.0
_NODE_INFO_RE = re.compile(r'^verlmon_node_info\{[^}]*\bnode="((?:[^"\\]|\\.)*)"', re.M)


class ConfigInputError(ValueError):
    """Bad input; the message is one line saying what to change."""


#: How ``verl-monitor prometheus-config`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "write a job's Prometheus file_sd targets (and optionally a config that reads them)",
    "description": ("Write DIR/JOB.json listing the job's exporters for Prometheus's file_sd "
        "(the shipped prometheus/prometheus.yml reads prometheus/targets/*.json), and with "
        "--config a Prometheus config for that folder. Example: verl-monitor prometheus-config "
        "--job grpo-qwen7b --targets gpu-01:9048,gpu-02:9048 --targets-dir prometheus/targets"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``verl-monitor prometheus-config``."""
    p.add_argument("--job", required=True, metavar="NAME",
                   help="the training job's name: the `job` label every rule groups by")
    p.add_argument("--targets", metavar="[NODE=]HOST[:PORT],...",
                   help="the job's exporters, comma- or space-separated (`scontrol show "
                   f"hostnames` output works); a host without a port gets {DEFAULT_PORT}; "
                   "NODE= names the node as its exporter's --node does (else the exporter is "
                   "asked, then the host is used)")
    p.add_argument("--no-ask", action="store_true",
                   help="do not ask the exporters for their node names (name them NODE= or "
                   "after their hosts)")
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


def target_groups(job: str, targets: str | None, ask: bool = True) -> list[dict[str, Any]]:
    """file_sd entries for ``targets`` of ``job``, each ``node`` label its exporter's node
    name (module docstring); raises ConfigInputError on bad input."""
    from cli.commands.run import RunError, file_sd_targets, parse_nodes

    if not _JOB_RE.match(job):
        raise ConfigInputError(f"--job {job!r}: use letters, digits, '.', '_' and '-' only")
    items = parse_nodes(targets)
    if not items:
        raise ConfigInputError("--targets: give the job's exporters, e.g. "
                               "gpu-01:9048,gpu-02:9048")
    named = [item.partition("=") for item in items]  # (NODE, "=", ADDR) or (ADDR, "", "")
    named = [(n, a) if sep else ("", n) for n, sep, a in named]
    for item, (name, addr) in zip(items, named, strict=True):
        if "=" in item and (not name or not addr or "=" in addr):
            raise ConfigInputError(f"--targets {item!r}: write NODE=HOST[:PORT]")
    try:
        groups = file_sd_targets([addr for _n, addr in named], DEFAULT_PORT, job)
    except RunError as exc:
        raise ConfigInputError(f"--targets: {exc}") from None
    addresses = [g["targets"][0] for g in groups]
    asked = _ask_nodes([a for a, (n, _a) in zip(addresses, named, strict=True) if not n]
                       if ask else [])
    hosts = [a.rpartition(":")[0] for a in addresses]
    for group, addr, host, (name, _a) in zip(groups, addresses, hosts, named, strict=True):
        node = name or asked.get(addr) or (addr if hosts.count(host) > 1 else host)
        group["labels"]["node"] = node
    nodes = [g["labels"]["node"] for g in groups]
    if len(set(nodes)) < len(nodes):
        twice = sorted({n for n in nodes if nodes.count(n) > 1})
        raise ConfigInputError(f"--targets: node {twice[0]!r} is named for two exporters; give "
                               "each its own NODE= (as its --node)")
    return groups


def _ask_nodes(addresses: list[str]) -> dict[str, str]:
    """{HOST:PORT: node} of the exporters that say their node name within ``ASK_TIMEOUT_S``
    (asked all at once; one that does not answer is left out)."""
    if not addresses:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(addresses))) as pool:
        names = list(pool.map(_ask_node, addresses))
    return {a: n for a, n in zip(addresses, names, strict=True) if n}


def _ask_node(address: str) -> str | None:
    """The ``node`` of ``verlmon_node_info`` on ``http://ADDRESS/metrics``, or None."""
    url = f"http://{address}/metrics?name[]=verlmon_node_info"
    try:
        with urllib.request.urlopen(url, timeout=ASK_TIMEOUT_S) as resp:  # noqa: S310
            text = resp.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    found = _NODE_INFO_RE.search(text)
    return found.group(1).replace('\\"', '"').replace("\\\\", "\\") if found else None


def prometheus_config(targets_dir: Path, rules_dir: Path, alertmanager: str,
                      runbook_base: str) -> dict[str, Any]:
    """A Prometheus config (as a dict) that scrapes every job listed in ``targets_dir``."""
    if not re.match(r"^https?://\S+/$", runbook_base):
        raise ConfigInputError(f"--runbook-base {redact(runbook_base)!r}: expected an http(s) "
                               "URL ending in /")
    if split_url(runbook_base, "--runbook-base").has_credentials:
        raise ConfigInputError(f"--runbook-base {redact(runbook_base)!r}: holds a user name or "
                               "password; the links go to everyone an alert reaches, give the "
                               "URL without USER:PASS@")
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


@exits("prometheus-config")
def run(args: argparse.Namespace) -> int:
    """Write (or remove) the targets file and the config; 0, or 2 on bad input."""
    import yaml

    from cli.commands.run import write_targets

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
        groups = target_groups(args.job, args.targets, ask=not args.no_ask)
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
        print(f"{PROG}: {len(groups)} target(s) of job {args.job} written to {path}: "
              + ", ".join(f"{g['labels']['node']} at {g['targets'][0]}" for g in groups))
        if config is not None:
            Path(args.config).write_text(
                "# Written by verl-monitor prometheus-config; see prometheus/prometheus.yml.\n"
                + yaml.safe_dump(config, sort_keys=False))
            print(f"{PROG}: config written to {args.config} "
                  f"(prometheus --config.file={args.config})")
    except ConfigInputError as exc:
        raise CommandError(str(exc)) from exc
    except OSError as exc:
        raise CommandError(f"cannot write {exc.filename or path}: {exc.strerror or exc}") \
            from exc
    return 0
