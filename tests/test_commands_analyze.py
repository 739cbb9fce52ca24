"""``verl-monitor analyze`` on real files: text and JSON reports, GPU attribution, and one-line
errors with exit status 2 for files that cannot be read."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from cli.main import main

T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc).timestamp()


def console_line(n: int, *, ts: float | None, gen: float = 40.0, lr: str = "2e-06") -> str:
    stamp = ""
    if ts is not None:
        stamp = datetime.fromtimestamp(ts, tz=timezone.utc).strftime("[%Y-%m-%d %H:%M:%S] ")
    keys = {
        "timing_s/gen": gen, "timing_s/old_log_prob": 5.0, "timing_s/update_actor": 10.0,
        "timing_s/update_weights": 2.0, "timing_s/step": gen + 20.0,
        "perf/throughput": 1500.0, "global_seqlen/minmax_diff": 200.0,
        "global_seqlen/mean": 1000.0, "response_length/max": 3000.0,
        "response_length/mean": 1000.0,
    }
    body = " - ".join(f"{k}:{v}" for k, v in keys.items())
    return f"{stamp}(TaskRunner pid=7) step:{n} - {body} - actor/lr:{lr}\n"


def write_log(path: Path, steps: int = 6, stamped: bool = True) -> list[float]:
    ends, t = [], T0
    with open(path, "w") as fh:
        for n in range(1, steps + 1):
            t += 60.0
            ends.append(t)
            fh.write(console_line(n, ts=t if stamped else None, lr="nan" if n == 2 else "2e-06"))
    return ends


def write_gpu(path: Path, ends: list[float], slow_gpu: int = 3) -> None:
    lines = ["ts,node,gpu,util,sm_active,mem_used_bytes,mem_total_bytes"]
    t = ends[0] - 60.0
    while t <= ends[-1]:
        for g in range(4):
            util = 35.0 if g == slow_gpu else 95.0
            lines.append(f"{t},n0,{g},{util},{util - 10},1000,8000")
        t += 1.0
    path.write_text("\n".join(lines) + "\n")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["analyze", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_report(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    write_log(log)
    code, out, err = run_cli(capsys, str(log))
    assert code == 0, err
    assert "6 step records, step 1 .. 6" in out
    assert "verl version guess 0.7.1+" in out
    gen = next(x for x in out.splitlines() if x.strip().startswith("gen "))
    assert "40.00 s" in gen and "66.7%" in gen
    assert "data-parallel token imbalance (global_seqlen minmax_diff / mean): mean 20.0%" in out
    assert "response_length max / mean): median 3.00x" in out


def test_the_trainer_mode_comes_from_the_printed_config_where_the_keys_cannot_tell(
        tmp_path: Path, capsys) -> None:
    """verl 0.9's V1 trainer prints the same step keys in every mode; the config it prints at
    the start names the trainer (``trainer.v1.trainer_mode``), and the report says so."""
    import pprint

    log = tmp_path / "train.log"
    write_log(log)
    code, out, _ = run_cli(capsys, str(log), "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["trainer_mode"], doc["trainer_mode_source"]) == ("sync", "keys")
    config = {"data": {"train_batch_size": 16},
              "trainer": {"nnodes": 1, "use_v1": True,
                          "v1": {"separate_async": {"parameter_sync_step": 1},
                                 "trainer_mode": "separate_async"}}}
    printed = "".join(f"(TaskRunnerV1 pid=7) {line}\n"
                      for line in pprint.pformat(config, width=60).split("\n"))
    log.write_text(printed + log.read_text())
    code, out, _ = run_cli(capsys, str(log), "--json")
    doc = json.loads(out)
    assert (doc["trainer_mode"], doc["trainer_mode_source"]) == ("separate_async", "config")
    assert [p["pool"] for p in doc["pools"]["pools"]] == ["trainer", "rollout"]
    code, out, _ = run_cli(capsys, str(log))
    assert code == 0
    assert "trainer: V1 separate-async trainer (separate rollout pool) (from the printed config)" in out


def test_json_is_strict_and_complete(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    ends = write_log(log)
    code, out, _ = run_cli(capsys, str(log), "--json")
    assert code == 0

    def no_constants(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    doc = json.loads(out, parse_constant=no_constants)
    assert doc["version_guess"] == "0.7.1+"
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3, 4, 5, 6]
    assert [s["end_time"] for s in doc["steps"]] == ends
    assert doc["steps"][1]["metrics"]["actor/lr"] is None  # nan -> null
    assert doc["steps"][0]["phases"]["reshard"] == 2.0
    assert doc["summary"]["throughput"]["mean"] == 1500.0
    assert isinstance(doc["flags"], list) and isinstance(doc["events"], list)
    for flag in doc["flags"]:
        assert set(flag) >= {"kind", "severity", "start", "end", "scope", "evidence", "advice"}


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_gpu_attribution_points_at_the_slow_gpu(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    ends = write_log(log)
    gpu = tmp_path / "gpu.csv"
    write_gpu(gpu, ends, slow_gpu=3)
    code, out, err = run_cli(capsys, str(log), "--gpu", str(gpu))
    assert code == 0, err
    assert "GPU activity per phase (from --gpu)" in out
    gen = next(x for x in out.splitlines() if x.strip().startswith("gen ") and "n0:" in x)
    assert "n0:3 35.0" in gen
    code, out, _ = run_cli(capsys, str(log), "--gpu", str(gpu), "--json")
    rows = json.loads(out)["attribution"]
    slow = [r for r in rows if r["phase"] == "gen" and r["gpu"] == 3]
    assert slow and slow[0]["util_mean"] == pytest.approx(35.0)


def test_log_end_accepts_unix_and_iso(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    write_log(log, steps=3, stamped=False)
    end = T0 + 3600
    _, out_unix, _ = run_cli(capsys, str(log), "--json", "--log-end", str(end))
    iso = datetime.fromtimestamp(end, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    _, out_iso, _ = run_cli(capsys, str(log), "--json", "--log-end", iso)
    a = [s["end_time"] for s in json.loads(out_unix)["steps"]]
    b = [s["end_time"] for s in json.loads(out_iso)["steps"]]
    assert a == b == [end - 120.0, end - 60.0, end]


def test_bad_log_end_is_a_usage_error(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    write_log(log, steps=1)
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(log), "--log-end", "yesterday"])
    assert exc.value.code == 2
    assert "not a time: 'yesterday'" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["log", "gpu", "host"])
def test_missing_file_is_one_line_exit_2(tmp_path: Path, capsys, which: str) -> None:
    log = tmp_path / "train.log"
    write_log(log, steps=1)
    args = {"log": str(log), "gpu": None, "host": None}
    args[which] = str(tmp_path / f"{which}.csv")
    argv = [args["log"]]
    if args["gpu"]:
        argv += ["--gpu", args["gpu"]]
    if args["host"]:
        argv += ["--host", args["host"]]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err == f"verl-monitor analyze: {tmp_path / f'{which}.csv'}: no such file\n"


def test_unreadable_gpu_file_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    write_log(log, steps=1)
    gpu = tmp_path / "gpu.csv"
    gpu.write_text("time,value\n1,2\n")
    code, _, err = run_cli(capsys, str(log), "--gpu", str(gpu))
    assert code == 2
    assert err.startswith("verl-monitor analyze: ") and "missing column" in err
    assert err.count("\n") == 1


def test_bad_config_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    log = tmp_path / "train.log"
    write_log(log, steps=1)
    code, _, err = run_cli(capsys, str(log), "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err and err.count("\n") == 1


def test_a_file_without_a_verl_line_says_so_and_exits_2(tmp_path: Path, capsys) -> None:
    """Issue 38 item 6: a file with no verl line used to get a clean report and exit 0."""
    log = tmp_path / "train.log"
    log.write_text("starting ray...\nloading model\n")
    for extra in ((), ("--json",)):
        code, out, err = run_cli(capsys, str(log), *extra)
        assert code == 2 and out == "", (code, out)
        assert err.startswith(f"verl-monitor analyze: {log}: no verl line in it (2 lines read")


def test_a_log_that_crashed_before_its_first_step_still_gets_a_report(tmp_path: Path,
                                                                      capsys) -> None:
    log = tmp_path / "train.log"
    log.write_text("starting ray...\nTraceback (most recent call last):\n"
                   '  File "main_ppo.py", line 3, in <module>\n'
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    code, out, _ = run_cli(capsys, str(log))
    assert code == 0 and "no training steps found in this log" in out


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_fail_on_makes_a_ci_job_fail_on_flags_that_severe(tmp_path: Path, capsys) -> None:
    """``--fail-on warning|critical``: exit 1 when the run raised such a flag, with the report
    printed all the same and the flags named on stderr; 0 when it raised none."""
    from monitor.sim.engine import SimRun

    SimRun("reshard_spike", steps=20, seed=3, timestamps=True).write(tmp_path / "bad")
    SimRun("healthy", steps=12, seed=3, timestamps=True).write(tmp_path / "good")
    bad = [str(tmp_path / "bad" / "train.log"), "--gpu", str(tmp_path / "bad" / "gpu.csv")]
    code, out, err = run_cli(capsys, *bad, "--fail-on", "critical")
    assert code == 1 and "Flags (" in out
    assert "--fail-on critical:" in err and "reshard_spike (critical)" in err
    code, _, _ = run_cli(capsys, *bad)
    assert code == 0
    good = [str(tmp_path / "good" / "train.log"), "--gpu", str(tmp_path / "good" / "gpu.csv")]
    code, _, err = run_cli(capsys, *good, "--fail-on", "warning")
    assert code == 0 and err == ""


@pytest.mark.parametrize("kind", ["elf", "random", "store"])
def test_a_file_that_is_not_a_log_is_one_line_exit_2(tmp_path: Path, capsys, kind: str) -> None:
    import os
    import shutil
    import sqlite3

    path = tmp_path / "input"
    if kind == "elf":
        shutil.copy("/usr/bin/ls", path)
    elif kind == "random":
        path.write_bytes(os.urandom(200_000))
    else:
        from monitor.store.runstore import RunStore

        RunStore(path).close()
        assert sqlite3.connect(path).execute("select 1").fetchone() == (1,)
    before = path.read_bytes()
    code, out, err = run_cli(capsys, str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("verl-monitor analyze: ")
    if kind == "store":
        assert "verl-monitor export" in err
    else:
        assert "not a verl log" in err
    assert path.read_bytes() == before  # nothing lost


@pytest.mark.parametrize("flag", ["--gpu", "--host"])
def test_a_binary_or_directory_table_is_one_line_exit_2(tmp_path: Path, capsys,
                                                        flag: str) -> None:
    """Issue 24: a non-CSV --gpu printed pandas' decoding error; now it says what it wants."""
    log = tmp_path / "train.log"
    write_log(log)
    blob = tmp_path / "gpu.bin"
    blob.write_bytes(bytes(range(256)) * 8)
    code, out, err = run_cli(capsys, str(log), flag, str(blob))
    assert code == 2 and out == ""
    assert err.strip() == (f"verl-monitor analyze: {flag} {blob}: is neither CSV nor Parquet "
                           "(samples as `verl-monitor export` writes them: gpu.csv, host.csv)")
    code, _, err = run_cli(capsys, str(log), flag, str(tmp_path))
    assert code == 2 and f"{flag} {tmp_path}: is a directory" in err


def test_fr_dir_names_the_rank_the_others_wait_for(tmp_path: Path, capsys) -> None:
    """A simulated hang's log and telemetry, with the Flight Recorder dumps of four ranks on two
    nodes (made from a real H200 dump; rank 2 never issued the all-reduce the others wait in)."""
    from hang_standins import as_rank, real_dump, write_dump

    assert main(["simulate", "--scenario", "healthy:6,hang:6", "--gpus-per-node", "2",
                 "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    for rank, node in ((0, "n0"), (1, "n0"), (2, "n1"), (3, "n1")):
        (tmp_path / "fr" / node).mkdir(parents=True, exist_ok=True)
        write_dump(tmp_path / "fr" / node / f"fr_{rank}",
                   as_rank(real_dump(), rank, 4, drop_after=13 if rank == 2 else None))
    (tmp_path / "fr" / "n1" / "fr_9").write_bytes(b"not a dump")
    run = tmp_path / "run"
    assert main(["analyze", str(run / "train.log"), "--gpu", str(run / "gpu.csv"),
                 "--fr-dir", str(tmp_path / "fr")]) == 0
    out = capsys.readouterr().out
    assert "Who holds the others" in out and "Flight Recorder dumps of 4 rank(s)" in out
    assert "cannot read: rank 9" in out
    hang = out[out.index("[CRITICAL] hang"):]
    assert "Who: rank 2: never issued nccl:all_reduce #14" in hang
    assert main(["analyze", str(run / "train.log"), "--fr-dir", str(tmp_path / "run")]) == 2
    assert "no fr_<rank> dump" in capsys.readouterr().err


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_rollout_samples_let_analyze_judge_the_engines(tmp_path: Path, capsys) -> None:
    """A simulated agent-loop run whose vLLM servers fill their KV cache and preempt: with the
    engines' samples (``--rollout``) the offline analysis names it, as the exporter does live."""
    assert main(["simulate", "--scenario", "agent_loop:6,kv_cache_preemption:8",
                 "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    args = ["analyze", str(run / "train.log"), "--gpu", str(run / "gpu.csv")]
    assert main(args) == 0
    assert "kv_cache_preemption" not in capsys.readouterr().out  # blind without the engines
    assert main([*args, "--rollout", str(run / "rollout.csv"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    kinds = {f["kind"] for f in doc["flags"] if f["severity"] in ("warning", "critical")}
    assert "kv_cache_preemption" in kinds
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert main([*args, "--rollout", str(tmp_path / "bad.csv")]) == 2
    assert "missing column(s) ts, server" in capsys.readouterr().err


REAL_HANG = Path(__file__).parent / "fixtures" / "real_verl" / "hang_reward_live"


def test_stacks_given_offline_replace_the_recorded_rounds_so_the_hang_names_its_place_once(
        capsys) -> None:
    """A real verl run whose reward hung (H200): its events already hold the exporter's py-spy
    rounds, and ``--stacks`` judges the same saved dumps again. The hang's evidence names the
    stuck driver's frame once, not once per reading."""
    d = REAL_HANG
    code, out, _ = run_cli(capsys, str(d / "train.log"), "--events",
                           str(d / "events.json"), "--stacks", str(d / "stacks_live"), "--json")
    assert code == 0
    hang = [f for f in json.loads(out)["flags"] if f["kind"] == "hang"]
    assert len(hang) == 1
    assert hang[0]["evidence"].count("_stuck_in_verifier (rewards.py:96)") == 1, hang[0]["evidence"]


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_a_copied_log_is_read_with_the_exported_samples_by_the_steps_they_share(
        tmp_path: Path, capsys) -> None:
    """The README's path on a real verl run (opt_offload_xl, H200): the console log copied
    without its .arrivals file dates its bar only by the dated line before it (a minute early),
    which gave a false flag and a wrong goodput. With the store's train.jsonl beside the
    samples the log is placed by the steps both have (goodput within a point of the original
    recording's); without it the samples are left out and the report says why (issue 37)."""
    import shutil

    src = Path(__file__).parent / "fixtures" / "real_verl" / "opt_offload_xl"
    log = tmp_path / "copy.log"
    shutil.copy(src / "train.log", log)
    rec = tmp_path / "rec"
    rec.mkdir()
    for name in ("gpu.csv", "host.csv", "train.jsonl"):
        shutil.copy(src / name, rec / name)
    args = ["analyze", str(log), "--gpu", str(rec / "gpu.csv"), "--host", str(rec / "host.csv")]
    code, out, _ = run_cli(capsys, *args[1:], "--json")
    doc = json.loads(out)
    assert code == 0 and doc["telemetry"]["aligned"] and "train.jsonl" in doc["telemetry"]["by"]
    assert not [f for f in doc["flags"] if f["severity"] != "info"]
    code, out, _ = run_cli(capsys, str(src / "train.log"), "--gpu", str(src / "gpu.csv"),
                           "--host", str(src / "host.csv"), "--json")
    original = json.loads(out)["goodput"]["goodput_share"]
    assert abs(doc["goodput"]["goodput_share"] - original) < 0.01
    (rec / "train.jsonl").unlink()
    code, out, _ = run_cli(capsys, *args[1:], "--json")
    doc = json.loads(out)
    assert doc["telemetry"]["aligned"] is False and doc["goodput"] is None
    assert not [f for f in doc["flags"] if f["kind"] == "stalled"]
    code, out, _ = run_cli(capsys, *args[1:])
    assert "GPU/host samples not used: the log places its steps only at or after" in out


#: Round 5 N4: OSC 52 (write the clipboard), OSC 8 (a hidden link), OSC 0 (the window title),
#: a CSI and a right-to-left override in log lines; N5: the same in a py-spy dump's frames.
ESCAPES = ("\x1b]52;c;cm0gLXJmIH4vKgo=\x07 \x1b]8;;http://evil.example\x07click\x1b]8;;\x07 "
           "\x1b]0;owned\x07 \x1b[2J \u202e gnp.exe")


def acting(text: str) -> list[str]:
    """Characters of ``text`` that act on a terminal or hide text (ESC, BEL, bidi overrides)."""
    return [c for c in text if c in "\x1b\x07\x9b\u202e\u2066\u2069\u200b"]


def test_log_text_reaches_the_terminal_inert(tmp_path: Path, capsys) -> None:
    """Before: ``analyze`` printed OSC 52/8/0 and U+202E from log lines raw (twice: the events
    table and the flag's evidence); now each shows as an escape (``\\x1b]52``)."""
    log = tmp_path / "osc52.log"
    log.write_text("(TaskRunner pid=1) step:1 - timing_s/step:30.0\n"
                   f"(TaskRunner pid=1) RuntimeError: CUDA error: out of memory {ESCAPES}\n")
    code, out, _ = run_cli(capsys, str(log))
    assert code == 0
    assert acting(out) == []
    assert out.count("\\x1b]52;c;cm0gLXJmIH4vKgo=\\x07") >= 2  # shown, not acted on
    assert "\\u202e gnp.exe" in out


def test_py_spy_frames_reach_the_terminal_inert(tmp_path: Path, capsys) -> None:
    """Round 5 N5: ``analyze --stacks`` printed ESC[2J, ESC[31m and an OSC 8 link to
    evil.example from the frames of a saved dump."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "1796162800.000_TaskRunner_3.txt").write_text(
        'Process 3: ray::TaskRunner.run\nThread 3 (active): "MainThread"\n'
        f"    evil{ESCAPES}RED (my.py:1)\n")
    log = tmp_path / "train.log"
    log.write_text("(TaskRunner pid=3) step:1 - timing_s/step:30.0\n")
    code, out, _ = run_cli(capsys, str(log), "--stacks", str(stacks))
    assert code == 0 and "py-spy rounds: 1" in out
    assert acting(out) == []


def test_an_error_line_shows_an_escape_in_a_file_name_escaped(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(capsys, str(tmp_path / "no\x1b]0;owned\x07.log"))
    assert code == 2
    assert acting(err) == [] and "no\\x1b]0;owned\\x07.log: no such file" in err
