"""The live monitor reads the job's printed config for its advice (monitor/live/job_config_watch.py),
as ``analyze`` does: on a real verl recording and on a log that is still being written."""

from __future__ import annotations

import shutil

import pytest
from live_replay import REAL_VERL, Replay

from exporters.options import ExporterOptions
from monitor.live.job_config_watch import JobConfigWatch

CONFIG_LINES = [
    "(TaskRunner pid=7) {'actor_rollout_ref': {'actor': {'fsdp_config': {'param_offload': False,\n",
    "(TaskRunner pid=7)                                                   'optimizer_offload': True},\n",
    "(TaskRunner pid=7)                                  'ppo_micro_batch_size_per_gpu': 1}},\n",
    "(TaskRunner pid=7)  'trainer': {'n_gpus_per_node': 1}}\n",
]


def test_the_config_is_found_once_verl_prints_it_and_then_kept(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("(TaskRunner pid=7) starting\n")
    t = [0.0]
    watch = JobConfigWatch([str(log)], retry_s=10.0, clock=lambda: t[0])
    assert watch.config() is None
    with log.open("a") as fh:
        fh.writelines(CONFIG_LINES)
    t[0] = 5.0
    assert watch.config() is None  # not looked at again before retry_s
    t[0] = 10.0
    got = watch.config()
    assert got["actor_rollout_ref"]["actor"]["fsdp_config"] == {"param_offload": False,
                                                                "optimizer_offload": True}
    assert watch.source == str(log)
    log.write_text("")  # the file is emptied: what was read stays
    t[0] = 100.0
    assert watch.config() == got


def test_a_log_whose_steps_began_with_no_config_is_not_read_again(tmp_path):
    """verl prints its config before step 1: once a step line came first, the watch stops
    reading that log's head (it used to read up to 64 MiB of it every 10 s for ever)."""
    log = tmp_path / "train.log"
    log.write_text("(TaskRunner pid=7) step:1 - timing_s/step:2.0\n")
    t = [0.0]
    watch = JobConfigWatch([str(log)], retry_s=10.0, clock=lambda: t[0])
    assert watch.config() is None
    with log.open("a") as fh:  # a config printed after the steps is not this job's start
        fh.writelines(CONFIG_LINES)
    t[0] = 100.0
    assert watch.config() is None
    assert JobConfigWatch([str(log)]).config() is None  # the same rule as a fresh read


def test_a_log_without_a_config_leaves_none(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step:1 - timing_s/step:2.0\n")
    assert JobConfigWatch([str(log), str(tmp_path / "missing.log")], retry_s=0).config() is None
    assert JobConfigWatch([]).config() is None


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_the_live_advice_names_the_value_this_real_job_has(tmp_path):
    """Real verl, micro-batches of one (H200): the live flag's first advice says what the job
    set, as offline analyze does, instead of only telling the user to raise it."""
    log = tmp_path / "train.log"
    shutil.copy(REAL_VERL / "tiny_micro" / "train.log", log)
    run = Replay("tiny_micro", ExporterOptions(log=(str(log),), window=1e9))
    try:
        opened = [f for s in run.parsed.steps for f in run.until(s.end_time + 2.0)[0]]
    finally:
        run.close()
    (flag,) = [f for f in opened if f.kind != "skipped_updates"]  # its NaN gradients (sdpa)
    assert flag.kind == "low_utilization"
    assert flag.advice[0].startswith("ppo_micro_batch_size_per_gpu is 1 in this job "
                                     "(actor_rollout_ref.actor)"), flag.advice[0]


def _v1_run(tmp_path, trainer_mode: str | None):
    """A run whose step lines have only the keys verl 0.9's V1 trainer prints in every mode,
    its weight sync 35% of each step, after its printed config (V1 ``trainer_mode``, or none)."""
    import pprint
    from datetime import datetime, timezone

    lines = []
    if trainer_mode:
        config = {"data": {"train_batch_size": 16},
                  "trainer": {"use_v1": True, "v1": {"trainer_mode": trainer_mode}}}
        lines += [f"(TaskRunnerV1 pid=7) {x}\n" for x in pprint.pformat(config, width=50).split("\n")]
    t0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc).timestamp()
    for n in range(1, 9):
        stamp = datetime.fromtimestamp(t0 + 60.0 * n, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"[{stamp}] (TaskRunnerV1 pid=7) step:{n} - timing_s/gen:28.0 - "
                     "timing_s/update_actor:10.0 - timing_s/update_weights:21.0 - "
                     "timing_s/step:60.0\n")
    log = tmp_path / "train.log"
    log.write_text("".join(lines))
    return log


def _live_flags(log) -> list:
    from live_replay import _OnItsClock

    from monitor.logs.canonical_records import parse_file

    steps = parse_file(str(log)).steps
    mon = _OnItsClock(ExporterOptions(log=(str(log),), window=1e9), "h200", 1.0)
    mon.open()
    try:
        mon.window.add_steps(steps)
        mon.clock = steps[-1].end_time + 2.0
        opened, _ = mon.detect_once()
    finally:
        mon.stop()
    return opened


def test_the_live_detectors_take_the_trainer_mode_from_the_printed_config(tmp_path):
    """As ``analyze`` does: with the printed config saying separate_async, the weight sync
    pauses the rollout pool's generation (weight_sync_pause); without it the keys read sync,
    the engines sleep through the sync, and nothing is flagged."""
    assert [f.kind for f in _live_flags(_v1_run(tmp_path, None))
            if f.kind == "weight_sync_pause"] == []
    paused = [f for f in _live_flags(_v1_run(tmp_path, "separate_async"))
              if f.kind == "weight_sync_pause"]
    assert len(paused) == 1 and "timing_s/update_weights" in paused[0].evidence


def test_the_exporter_keeps_the_printed_config_in_its_store_and_gives_it_to_its_views(tmp_path):
    """Once found, the printed config is in the store's meta (the dashboard reads the trainer
    mode there) and in the views' context (the goodput counter's ledger), as it was printed."""
    from live_replay import _OnItsClock

    from monitor.logs.canonical_records import parse_file
    from monitor.store.runstore import RunStore

    log = _v1_run(tmp_path, "separate_async")
    store = tmp_path / "run.db"
    mon = _OnItsClock(ExporterOptions(log=(str(log),), window=1e9, store=str(store)), "h200", 1.0)
    mon.open()
    try:
        views = mon.view_context()
        steps = parse_file(str(log)).steps
        mon.add_steps(steps)
        mon.clock = steps[-1].end_time + 2.0
        mon.detect_once()
        assert views.job_config()["trainer"]["v1"] == {"trainer_mode": "separate_async"}
    finally:
        mon.stop()
    with RunStore(store, create=False) as rs:
        saved = rs.meta()["job_config"]
    assert saved == {"data": {"train_batch_size": 16},
                     "trainer": {"use_v1": True, "v1": {"trainer_mode": "separate_async"}}}


def test_a_value_cut_short_is_not_stored():
    """verl's print cuts long values to ``...``: they are not known, so the store keeps none
    of them (JSON has no ``...``), and tuples and sets become lists."""
    from monitor.live.job_config_watch import storable

    printed = {"a": {"kept": (1, 2), "cut": ..., "cut_list": [1, ...], "names": {"x"}},
               "trainer": {"use_v1": True}}
    assert storable(printed) == {"a": {"kept": [1, 2], "names": ["x"]},
                                 "trainer": {"use_v1": True}}


def test_the_found_config_is_handed_on_once(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(CONFIG_LINES))
    got = []
    watch = JobConfigWatch([str(log)], retry_s=0, on_found=got.append)
    assert watch.config() is not None and watch.config() is not None
    assert got == [watch.config()]


def test_a_config_caught_half_printed_is_read_again_until_whole(tmp_path):
    """The live watch read the log while verl was still printing its config: what it has is
    not kept for good; a later look reads the whole, trainer mode included (issue 41)."""
    import pprint

    from monitor.live.job_config_watch import JobConfigWatch

    config = {"actor_rollout_ref": {"rollout": {"n": 8}}, "data": {"train_batch_size": 8},
              "trainer": {"use_v1": True, "v1": {"trainer_mode": "separate_async"}}}
    lines = ["(TaskRunner pid=9) " + ln for ln in pprint.pformat(config, width=30).split("\n")]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines[:2]) + "\n")
    now = [0.0]
    watch = JobConfigWatch([str(log)], retry_s=10.0, clock=lambda: now[0])
    first = watch.config()
    assert first is not None and "trainer" not in first  # read as far as it was printed
    log.write_text("\n".join(lines) + "\nstep:1 - timing_s/step:1.0\n")
    now[0] = 11.0
    assert watch.config() == config
