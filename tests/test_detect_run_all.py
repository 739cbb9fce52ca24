"""run_all end to end: a simulated run written to disk, parsed, read back and judged."""

import pytest
from detect_builders import make_gpu, make_host, make_steps

from monitor.config import load_config
from monitor.detect import DETECTORS, run_all
from monitor.frames import empty_gpu_frame, empty_host_frame, read_gpu_frame, read_host_frame
from monitor.logs.canonical_records import parse_file
from monitor.records import FLAG_KINDS, SEVERITIES
from monitor.sim.engine import SimRun


def _through_files(tmp_path, scenario, **kw):
    run = SimRun(scenario, steps=30, seed=3, **kw)
    run.write(tmp_path)
    parsed = parse_file(tmp_path / "train.log")
    return run, run_all(parsed.steps, read_gpu_frame(tmp_path / "gpu.csv"),
                        read_host_frame(tmp_path / "host.csv"), parsed.events)


def test_every_kind_has_a_detector():
    assert list(DETECTORS) == list(FLAG_KINDS)


def test_empty_inputs_give_no_flags():
    assert run_all([], empty_gpu_frame(), empty_host_frame(), []) == []
    assert run_all([], None, None, []) == []


def test_healthy_simulated_run_raises_nothing(tmp_path):
    _, flags = _through_files(tmp_path, "healthy")
    assert [f for f in flags if f.severity in ("warning", "critical")] == []


def test_straggler_gpu_is_found_through_the_whole_path(tmp_path):
    run, flags = _through_files(tmp_path, "gpu_imbalance", verl_version="0.6")
    truth = run.truth[0]
    hits = [f for f in flags if f.kind == "gpu_imbalance"]
    assert len(hits) == 1
    f = hits[0]
    assert f.scope["gpus"] == truth["scope"]["gpus"]
    assert truth["start"] <= f.start <= truth["end"]
    assert f.severity in SEVERITIES and f.advice and f.evidence.endswith(".")
    # the slower steps are explained by the straggler: no separate throughput flag
    assert not [x for x in flags if x.kind == "throughput_regression"]


def test_a_user_config_changes_the_outcome(tmp_path):
    steps = make_steps(20)

    def edit(df):
        sel = (df["gpu"] == 3) & (df["step"] >= 5) & (df["util"] > 20)
        df.loc[sel, "sm_active"] *= 0.55

    gpu = make_gpu(steps, edit=edit)
    host = make_host(gpu)
    assert [f.kind for f in run_all(steps, gpu, host, [])] == ["gpu_imbalance"]
    cfg = tmp_path / "strict.yaml"
    cfg.write_text("gpu_imbalance:\n  ratio: 0.4\n")
    assert run_all(steps, gpu, host, [], config=load_config(str(cfg))) == []


def test_now_in_the_future_reveals_a_stall():
    steps = make_steps(20)
    gpu = make_gpu(steps)
    flags = run_all(steps, gpu, make_host(gpu), [], now=steps[-1].end_time + 900)
    assert [f.kind for f in flags] == ["stalled"]
    assert flags[0].end is None


def test_symptoms_are_hidden_behind_their_cause():
    steps = make_steps(30)

    def edit(df):
        train = df["phase"].isin(["old_log_prob", "ref", "update_actor"]) & (df["step"] >= 8)
        df.loc[train, "util"] = 91.0
        df.loc[train, "sm_active"] = 10.0

    gpu = make_gpu(steps, edit=edit)
    kinds = {f.kind for f in run_all(steps, gpu, make_host(gpu), [])}
    assert "util_overstates_sm" in kinds and "low_utilization" not in kinds
    cfg = load_config()
    cfg["suppress"] = {}
    kinds = {f.kind for f in run_all(steps, gpu, make_host(gpu), [], config=cfg)}
    assert {"util_overstates_sm", "low_utilization"} <= kinds


def test_a_broken_detector_does_not_silence_the_others(monkeypatch, caplog):
    steps = make_steps(20)
    gpu = make_gpu(steps)

    def boom(ctx):
        raise RuntimeError("bug")

    monkeypatch.setitem(DETECTORS, "gpu_imbalance", boom)
    flags = run_all(steps, gpu, make_host(gpu), [], now=steps[-1].end_time + 900)
    assert [f.kind for f in flags] == ["stalled"]
    assert "gpu_imbalance failed" in caplog.text


@pytest.mark.parametrize("version", ["0.2", "0.4.1", "0.9"])
def test_old_and_new_verl_versions_parse_and_stay_quiet_when_healthy(tmp_path, version):
    _, flags = _through_files(tmp_path, "healthy", verl_version=version)
    assert [f.kind for f in flags if f.severity != "info"] == []


def test_frames_missing_optional_columns_still_work():
    steps = make_steps(20)
    gpu = make_gpu(steps)[["ts", "node", "gpu", "util"]]  # no SM activity, no memory columns
    gpu.loc[(gpu["gpu"] == 2) & (gpu["util"] > 20) & (gpu["ts"] > steps[5].end_time), "util"] = 20.0
    host = make_host(gpu)[["ts", "node", "cpu_max_core_pct"]]
    flags = run_all(steps, gpu, host, [])
    assert [(f.kind, f.scope.get("gpus")) for f in flags] == [("gpu_imbalance", [2])]
    assert "utilization" in flags[0].evidence


@pytest.mark.parametrize("kind", FLAG_KINDS)
def test_each_detector_copes_with_partial_inputs(kind):
    from monitor.detect import make_context

    steps = make_steps(3)
    gpu = make_gpu(steps, n_gpus=1, sm=False)
    detector = DETECTORS[kind]
    cases = [
        (steps, empty_gpu_frame(), empty_host_frame()),   # log only
        ([], gpu, make_host(gpu)),                         # telemetry only
        (steps[:1], gpu.iloc[:1], empty_host_frame()),    # one step, one sample
    ]
    for s, g, h in cases:
        ctx = make_context(s, g, h, [], load_config())
        assert detector(ctx) == []
