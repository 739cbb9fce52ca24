"""SimRun: determinism, step timeline, phase shares, telemetry signatures, written files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS, read_gpu_frame, read_host_frame
from monitor.records import PHASES
from monitor.sim.engine import SimRun


@pytest.fixture(scope="module")
def healthy() -> SimRun:
    return SimRun("healthy", steps=40, seed=3)


def _phase_means(run: SimRun, phase: str, column: str) -> float:
    """Mean of a GPU column over samples taken in the middle of every ``phase`` interval."""
    values = []
    for st in run.steps:
        for label, a, b in st.timeline:
            if label == phase:
                for frac in (0.3, 0.5, 0.7):
                    values += [row[column] for row in run.gpu_sample_at(a + frac * (b - a))]
    return float(np.mean(values))


def test_same_seed_gives_identical_run_and_other_seed_differs():
    a = SimRun("io_starvation", steps=12, seed=5)
    b = SimRun("io_starvation", steps=12, seed=5)
    c = SimRun("io_starvation", steps=12, seed=6)
    assert a.timed_lines() == b.timed_lines()
    assert a.truth == b.truth
    t = a.steps[7].start + 3.3
    assert a.gpu_sample_at(t) == b.gpu_sample_at(t)
    assert a.host_sample_at(t, "node0") == b.host_sample_at(t, "node0")
    assert a.timed_lines() != c.timed_lines()


def test_same_seed_writes_byte_identical_files(tmp_path):
    SimRun("gpu_imbalance", steps=6, gpus_per_node=2, seed=9).write(tmp_path / "a", jsonl=True)
    SimRun("gpu_imbalance", steps=6, gpus_per_node=2, seed=9).write(tmp_path / "b", jsonl=True)
    for name in ("train.log", "train.jsonl", "gpu.csv", "host.csv", "truth.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_healthy_run_has_no_truth_and_steady_steps(healthy):
    assert healthy.truth == []
    assert [s.step for s in healthy.steps] == list(range(1, 41))
    totals = np.array([s.total for s in healthy.steps])
    assert np.all(np.abs(totals / 30.0 - 1.0) < 0.10)
    assert totals.std() / totals.mean() < 0.05
    assert healthy.end_time == pytest.approx(healthy.steps[-1].end)


def test_steps_are_contiguous_and_phases_ordered_inside_them(healthy):
    for prev, st in zip(healthy.steps, healthy.steps[1:], strict=False):
        assert st.start == pytest.approx(prev.end)
    for st in healthy.steps:
        spans = list(st.phases.values())
        assert spans[0][0] >= st.start and spans[-1][1] <= st.end + 1e-6
        for (a0, b0), (a1, _b1) in zip(spans, spans[1:], strict=False):
            assert a0 < b0 <= a1 + 1e-6
        assert set(st.phases) <= set(PHASES)
        assert sum(st.durations().values()) == pytest.approx(st.total, abs=2e-3)


def test_healthy_phase_shares_match_a_real_ppo_step(healthy):
    shares = {p: [] for p in ("gen", "update_actor", "old_log_prob", "ref", "reshard")}
    for st in healthy.steps:
        d = st.durations()
        for p in shares:
            shares[p].append(d[p] / st.total)
    mean = {p: float(np.mean(v)) for p, v in shares.items()}
    assert 0.45 <= mean["gen"] <= 0.55
    assert 0.20 <= mean["update_actor"] <= 0.25
    assert 0.12 <= mean["old_log_prob"] + mean["ref"] <= 0.15
    assert 0.02 <= mean["reshard"] <= 0.04


def test_timing_keys_match_phase_durations(healthy):
    for st in healthy.steps:
        d = st.durations()
        assert st.metrics["timing_s/step"] == pytest.approx(st.total, abs=1e-6)
        assert st.metrics["timing_s/gen"] == pytest.approx(d["gen"], abs=1e-6)
        assert st.metrics["timing_s/update_weights"] == pytest.approx(d["reshard"], abs=1e-6)
        assert st.metrics["timing_s/update_actor"] == pytest.approx(d["update_actor"], abs=1e-6)


def test_gpu_sample_has_every_gpu_and_the_interchange_columns():
    run = SimRun(steps=3, nodes=3, gpus_per_node=4)
    rows = run.gpu_sample_at(run.steps[1].start + 5)
    assert [(r["node"], r["gpu"]) for r in rows] == [
        (f"node{n}", g) for n in range(3) for g in range(4)
    ]
    extras = {"sm_occupancy", "temperature_c", "sm_clock_hz", "energy_j", "up", "xid",
              "clock_events"}
    for row in rows:
        assert set(GPU_COLUMNS) | extras <= set(row)
        assert row["up"] is True
        assert row["mem_total_bytes"] == 150_754_820_096
    host = run.host_sample_at(run.steps[1].start + 5, "node2")
    assert set(host) == set(HOST_COLUMNS) and host["node"] == "node2"


def test_phase_signatures(healthy):
    sm_update = _phase_means(healthy, "update_actor", "sm_active")
    sm_gen = _phase_means(healthy, "gen", "sm_active")
    util_gen = _phase_means(healthy, "gen", "util")
    assert sm_update > sm_gen + 15
    assert util_gen > 88 and sm_gen < 70 and util_gen - sm_gen > 25
    assert _phase_means(healthy, "reward", "util") < 20
    assert _phase_means(healthy, "update_actor", "tensor_active") > 60


def test_memory_jumps_during_reshard_and_falls_back(healthy):
    st = healthy.steps[10]
    iv = {label: (a, b) for label, a, b in st.timeline}
    a, b = iv["reshard"]
    ua = iv["update_actor"]
    during = np.mean([r["mem_used_bytes"] for r in healthy.gpu_sample_at(a + 0.3 * (b - a))])
    before = np.mean([r["mem_used_bytes"] for r in healthy.gpu_sample_at((ua[0] + ua[1]) / 2)])
    nxt = healthy.steps[11]
    gen = [(x, y) for lab, x, y in nxt.timeline if lab == "gen"][0]
    after = np.mean([r["mem_used_bytes"] for r in healthy.gpu_sample_at((gen[0] + gen[1]) / 2)])
    assert during > before * 1.08
    assert after < during * 0.92
    assert 0.60 <= before / 150_754_820_096 <= 0.78


def test_energy_is_cumulative_and_power_tracks_activity(healthy):
    times = np.linspace(healthy.start_time, healthy.end_time, 200)
    energy = np.array([healthy.gpu_sample_at(t)[0]["energy_j"] for t in times])
    assert np.all(np.diff(energy) > 0)
    idle = _phase_means(healthy, "adv", "power_w")
    busy = _phase_means(healthy, "update_actor", "power_w")
    assert idle < 150 and busy > 500


def test_phase_at_names_the_timeline_label(healthy):
    st = healthy.steps[4]
    for label, a, b in st.timeline:
        assert healthy.phase_at((a + b) / 2) == label
    assert healthy.phase_at(healthy.start_time - 1) == "idle"
    assert healthy.phase_at(healthy.end_time + 1) == "idle"


def test_before_and_after_the_run_gpus_are_idle(healthy):
    for t in (healthy.start_time - 100, healthy.end_time + 100):
        assert max(r["util"] for r in healthy.gpu_sample_at(t)) < 10


def test_write_produces_readable_files_and_log_mtime_is_last_step_end(tmp_path):
    run = SimRun("reshard_spike", steps=8, gpus_per_node=2, seed=2)
    run.write(tmp_path, jsonl=True)
    log = tmp_path / "train.log"
    assert os.stat(log).st_mtime == pytest.approx(run.steps[-1].end, abs=1e-3)
    lines = log.read_text().splitlines()
    assert sum(1 for ln in lines if "step:" in ln and "timing_s/step" in ln) == 8
    gpu = read_gpu_frame(tmp_path / "gpu.csv")
    host = read_host_frame(tmp_path / "host.csv")
    assert len(gpu) == 2 * len(host)
    assert gpu["ts"].min() == pytest.approx(run.start_time)
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert [e["kind"] for e in truth["truth"]] == ["reshard_spike"]
    assert len(truth["steps"]) == 8
    objs = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert objs[0]["step"] == 0 and [o["step"] for o in objs[1:]] == list(range(1, 9))
    assert objs[3]["data"]["timing_s/step"] == run.steps[2].metrics["timing_s/step"]


def test_rebase_shifts_every_time_consistently():
    run = SimRun("gpu_fault", steps=9, gpus_per_node=2, seed=4)
    ref = SimRun("gpu_fault", steps=9, gpus_per_node=2, seed=4)
    dt = 1_000_000.25
    run.rebase(ref.start_time + dt)
    assert run.steps[4].phases["gen"][0] == pytest.approx(ref.steps[4].phases["gen"][0] + dt)
    assert run.truth[0]["start"] == pytest.approx(ref.truth[0]["start"] + dt)
    t = ref.steps[6].start + 2.0
    a = run.gpu_sample_at(t + dt)
    b = ref.gpu_sample_at(t)
    assert [r["xid"] for r in a] == [r["xid"] for r in b]
    assert a[0]["mem_used_bytes"] == pytest.approx(b[0]["mem_used_bytes"], rel=0.02)


def test_timestamps_prefix_every_line_with_iso_time():
    run = SimRun(steps=3, timestamps=True, start_time=1_800_000_000.0)
    lines = run.preamble() + run.log_lines(0)
    assert all(line[:4] == "2027" and line[10] == "T" for line in lines)
    assert run.log_lines(0)[0].startswith("2027-01-15T08:00:30.")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="valid: healthy"):
        SimRun("nope")
    with pytest.raises(ValueError, match="valid: 0.2"):
        SimRun(verl_version="1.7")
    with pytest.raises(ValueError, match="log format"):
        SimRun(log_format="xml")


ROUND_TRIP = [("console", v, ts) for v in ("0.2", "0.3", "0.4.0", "0.4.1", "0.5", "0.6", "0.7.0",
                                            "0.7.1", "0.8", "0.9") for ts in (False, True)]
ROUND_TRIP += [("breakdown", "0.7.1", False), ("breakdown", "0.7.1", True)]


@pytest.mark.parametrize("fmt,version,timestamps", ROUND_TRIP)
def test_parser_recovers_phases_and_end_times_of_every_version(tmp_path, fmt, version,
                                                               timestamps):
    from monitor.logs.canonical_records import parse_file

    run = SimRun("rollout_wait", steps=6, gpus_per_node=2, seed=7, verl_version=version,
                 timestamps=timestamps, log_format=fmt)
    run.write(tmp_path, jsonl=True)
    files = ["train.log"] + (["train.jsonl"] if fmt == "console" else [])
    for name in files:
        parsed = parse_file(tmp_path / name)
        assert parsed.stats.parse_errors == 0
        assert [s.step for s in parsed.steps] == [s.step for s in run.steps]
        # the console log has its capture times beside it (train.log.arrivals, as
        # `verl-monitor run` writes them); verl's file logger stamps nothing, so the JSONL's
        # times are relative: its steps back to back from 0, by their timers
        relative = name.endswith(".jsonl")
        assert parsed.clock == ("relative" if relative else "absolute"), name
        prev = 0.0
        for got, want in zip(parsed.steps, run.steps, strict=True):
            expect = want.durations()
            assert set(got.phases) == set(expect), (name, got.step)
            for phase, seconds in expect.items():
                assert got.phases[phase] == pytest.approx(seconds, abs=1.5e-3), (name, phase)
            if relative:
                assert got.end_time - prev == pytest.approx(want.end - want.start, abs=2e-3)
                prev = got.end_time
            else:
                assert got.end_time == pytest.approx(want.end, abs=2e-3)


def test_a_healthy_run_reads_healthy_in_every_training_phase(tmp_path):
    """The simulator's healthy steps read as healthy runs do: each training phase at its SM
    activity where the analysis lays it out (the untimed host work last, as ``other``), so
    the node with the log of a healthy 4-node job raises nothing (issue 37 item 7: its
    training phases read 63-68% SM, under the 70% low_utilization calls healthy)."""
    from monitor.analysis.run_analysis import RunAnalysis
    from monitor.detect import run_all
    from monitor.logs.canonical_records import parse_file
    from monitor.records import TRAINING_PHASES

    run = SimRun(scenario="healthy", steps=20, nodes=4, gpus_per_node=4, seed=0,
                 timestamps=True)
    run.write(tmp_path)
    parsed = parse_file(tmp_path / "train.log")
    gpu = run.gpu_frame(1.0)
    gpu = gpu[gpu["node"] == "node0"]
    host = run.host_frame(1.0)
    summary = RunAnalysis(parsed.steps, gpu).phase_summary()
    training = summary[summary["phase"].isin(TRAINING_PHASES) & (summary["withheld"] == "")]
    assert len(training) and (training["sm_mean"] >= 70.0).all(), training
    flags = run_all(parsed.steps, gpu, host[host["node"] == "node0"], parsed.events)
    assert [f.kind for f in flags if f.severity in ("warning", "critical")] == []
