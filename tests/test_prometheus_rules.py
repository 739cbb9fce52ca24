"""Prometheus config, recording and alert rules: real promtool checks and unit tests, plus
the contract between the rules, the exported metric names, the flag kinds and the runbooks."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitor import metric_names
from monitor.detect.flag_advice import ADVICE, INVENTED_KEYS, REAL_KEYS
from monitor.records import FLAG_KINDS, SEVERITIES

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
#: How the cross-node alerts build absolute runbook links (prometheus.yml's external label).
RUNBOOK_BASE = "{{ $externalLabels.runbook_base }}"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")

#: A dotted config key as advice writes it (``a.b`` or ``a.b.c_d``, or ``global_profiler.*``).
KEY_RE = re.compile(
    r"\b(?:actor_rollout_ref|data|trainer|global_profiler|critic|reward_model)"
    r"(?:(?:\.[a-z_][a-z0-9_]*)+(?:\.\*)?|\.\*)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool with a bound on its run time."""
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def load_rules() -> list[dict]:
    rules: list[dict] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def alert_rules() -> list[dict]:
    return [r for r in load_rules() if "alert" in r]


def camel(kind: str) -> str:
    """``rollout_long_tail`` -> ``RolloutLongTail``."""
    return "".join(part.capitalize() for part in kind.split("_"))


def runbook_anchors() -> set[str]:
    """GitHub-style anchors of the runbook's headings."""
    anchors = set()
    for line in RUNBOOKS.read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


@pytest.mark.slow
@needs_promtool
def test_example_prometheus_config_is_valid() -> None:
    res = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


@pytest.mark.slow
@needs_promtool
def test_rules_pass_promtool_lint() -> None:
    res = promtool("check", "rules", "--lint-fatal", *map(str, RULE_FILES))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
@needs_promtool
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    res = promtool("test", "rules", str(test_file))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
@needs_promtool
def test_promtool_catches_a_broken_threshold(tmp_path: Path) -> None:
    """The unit tests really constrain the rules: loosening the cross-node busy guard fails."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        text = path.read_text().replace(
            "job:verlmon_gpu_sm_active:median_rate1m > 0.25",
            "job:verlmon_gpu_sm_active:median_rate1m > 0",
        )
        (tmp_path / "rules" / path.name).write_text(text)
    test_copy = tmp_path / "tests" / "crossnode_alerts_test.yml"
    test_copy.write_text((PROM / "tests" / "crossnode_alerts_test.yml").read_text())
    res = promtool("test", "rules", str(test_copy))
    assert res.returncode != 0
    assert 'job="idle"' in res.stdout + res.stderr


def test_every_flag_kind_has_an_alert() -> None:
    by_name = {r["alert"]: r for r in alert_rules()}
    for kind in FLAG_KINDS:
        rule = by_name.get(f"Verl{camel(kind)}")
        assert rule is not None, f"no alert for flag kind {kind}"
        assert f'verlmon_flag_active{{kind="{kind}"}}' in rule["expr"]
        # severity comes from the flag's own label, so the rule must not override it
        assert "severity" not in rule.get("labels", {})


def test_flag_alert_advice_agrees_with_the_detectors_advice() -> None:
    """Slack (through Prometheus) and the exporter's own flag advice point at the same levers."""
    by_name = {r["alert"]: r for r in alert_rules()}
    for kind in FLAG_KINDS:
        description = by_name[f"Verl{camel(kind)}"]["annotations"]["description"]
        assert "Advice:" in description, kind
        ours = {k.rstrip(".") for k in KEY_RE.findall(description)}
        theirs = {k.rstrip(".") for k in KEY_RE.findall(" ".join(ADVICE.get(kind, [])))}
        assert ours, f"{kind}: the alert's advice names no verl key"
        if theirs:
            assert ours & theirs, f"{kind}: {sorted(ours)} shares no key with {sorted(theirs)}"


def test_every_alert_is_documented_and_labelled() -> None:
    anchors = runbook_anchors()
    for rule in alert_rules():
        name = rule["alert"]
        labels = rule.get("labels", {})
        ann = rule["annotations"]
        is_flag = "verlmon_flag_active" in rule["expr"]
        if not is_flag:
            assert labels.get("severity") in SEVERITIES, name
            assert labels.get("kind") in (*FLAG_KINDS, "exporter"), name
            assert "$value" in ann["description"] + ann["summary"], name
        assert ann["summary"] and ann["description"], name
        # absolute, from the one configurable base (issue 24): Grafana and the dashboard show
        # the annotation as it is, so a relative path there led nowhere
        anchor = f"docs/runbooks.md#{name.lower()}"
        assert ann["runbook_url"] == f"{RUNBOOK_BASE}{anchor}", name
        assert ann["description"].rstrip().endswith(f"Runbook: {RUNBOOK_BASE}{anchor}"), name
        assert name.lower() in anchors, f"docs/runbooks.md has no section for {name}"


def test_rules_only_use_exported_metric_names() -> None:
    exported = {v for k, v in vars(metric_names).items() if k.isupper() and k != "PREFIX"}
    exported |= {h + suffix for h in metric_names.HISTOGRAMS
                 for suffix in ("_bucket", "_sum", "_count")}
    recorded = {r["record"] for r in load_rules() if "record" in r}
    text = "\n".join(p.read_text() for p in RULE_FILES)
    used = set(re.findall(r"(?<![:\w])verlmon_[a-z_]+(?![:\w])", text))
    assert used, "no metric found: the pattern is wrong"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    for name in re.findall(r"\b(?:job|node|instance_gpu):verlmon_[a-z_]+:[a-z0-9_]+", text):
        assert name in recorded, f"{name} is used but never recorded"


def test_advice_names_only_real_verl_keys() -> None:
    texts = {p.name: p.read_text() for p in RULE_FILES}
    texts["runbooks.md"] = RUNBOOKS.read_text()
    found = set()
    for name, text in texts.items():
        for bad in INVENTED_KEYS:
            assert bad not in text, f"{name} advises the invented key {bad}"
        for key in KEY_RE.findall(text):
            key = key.rstrip(".")
            assert key in REAL_KEYS, f"{name}: {key} is not a real verl key"
            found.add(key)
    assert len(found) >= 10, "advice should name the real levers"


def test_shipped_scrape_config_is_safe_to_start() -> None:
    """file_sd only and no targets shipped: started as the README says, it scrapes nothing
    and pages nothing until a job's targets file is written (issue 24: example targets paged
    ExporterDown for nodes that do not exist)."""
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert cfg["global"]["scrape_interval"] == "15s"
    assert cfg["global"]["evaluation_interval"] == "15s"
    assert cfg["global"]["external_labels"]["runbook_base"].startswith("https://")
    assert cfg["global"]["external_labels"]["runbook_base"].endswith("/")
    assert set(cfg["rule_files"]) == {"rules/recording.yml", "rules/alerts.yml"}
    for job in cfg["scrape_configs"]:
        assert set(job) & {"static_configs", "file_sd_configs"} == {"file_sd_configs"}, job
        assert any(r.get("target_label") == "node" for r in job["relabel_configs"]), job
    assert list((PROM / "targets").glob("*.json")) == []


def test_crossnode_alerts_say_what_to_do_with_an_absolute_runbook_link() -> None:
    """Each cross-node alert's description carries the first line of the detector's advice
    (real verl keys) and its runbook, both built from the one configurable base URL."""
    first = ADVICE["gpu_imbalance"][0]
    for rule in alert_rules():
        if rule["alert"] not in ("GPUStraggler", "NodeImbalance"):
            continue
        ann = rule["annotations"]
        anchor = f"docs/runbooks.md#{rule['alert'].lower()}"
        assert f"Advice: {first}" in ann["description"], rule["alert"]
        assert f"Runbook: {RUNBOOK_BASE}{anchor}" in ann["description"], rule["alert"]
        assert ann["runbook_url"] == f"{RUNBOOK_BASE}{anchor}", rule["alert"]
        # no keep_firing_for: a page must resolve once its targets are gone
        assert "keep_firing_for" not in rule and "up == 1" in rule["expr"], rule["alert"]


def test_every_alert_is_listed_in_the_prometheus_readme() -> None:
    text = (PROM / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)`", text, re.M))
    names = {r["alert"] for r in alert_rules() if "verlmon_flag_active" not in r["expr"]
             or r["alert"] == "VerlLowUtilization"}
    assert names - listed == set(), "alerts missing from prometheus/README.md's table"


@pytest.mark.slow
def test_every_alert_has_unit_tests_for_firing_and_quiet() -> None:
    """Each alert name appears in the promtool tests both with expected alerts and with none."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - fires == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet or resolved"
