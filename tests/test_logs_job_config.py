"""verl's printed config: read from Ray-prefixed, coloured, pprint-wrapped lines, kept when cut
short, and told to the advice (a knob is named with its value; nothing is advised that the
job already has)."""

from __future__ import annotations

import pprint

from monitor.detect.cause_advice import cause_advice
from monitor.detect.flag_advice import (
    ADVICE,
    EXCEPTION_ADVICE,
    REAL_KEYS,
    advice_with_job_config,
    named_keys,
    with_job_config,
)
from monitor.logs.job_config import flatten, read_job_config, read_job_config_file

PREFIX = "\x1b[36m(TaskRunner pid=2741)\x1b[0m "
CONFIG = {
    "actor_rollout_ref": {
        "actor": {"fsdp_config": {"optimizer_offload": True, "param_offload": False,
                                  "wrap_policy": {"min_num_params": 0}},
                  "checkpoint": {"save_contents": ["model", "optimizer", "extra"]},
                  "ppo_micro_batch_size_per_gpu": 4},
        "model": {"path": "/tmp/it's a model", "override_config": {}},
        "rollout": {"name": "hf", "gpu_memory_utilization": 0.5, "n": 4},
    },
    "data": {"train_batch_size": 32, "max_response_length": 128},
    "trainer": {"logger": ["console"], "save_freq": -1, "test_freq": 10},
}


def _printed(config: dict) -> list[str]:
    """The lines verl's TaskRunner prints (pprint, wrapped at 80 columns) under Ray's prefix."""
    lines = [PREFIX + "TaskRunner hostname: h200-0, PID: 2741"]
    lines += [PREFIX + line for line in pprint.pformat(config).split("\n")]
    return lines + [PREFIX + "Size of train dataloader: 8, Size of val dataloader: 1"]


def test_the_printed_config_is_read_whole_across_prefixed_wrapped_lines(tmp_path):
    lines = _printed(CONFIG)
    assert len(lines) > 8  # pprint wrapped it
    assert read_job_config(lines) == CONFIG
    # another actor's line printed in between does not end it
    between = lines[:4] + ["\x1b[36m(WorkerDict pid=3007)\x1b[0m loading the model"] + lines[4:]
    assert read_job_config(between) == CONFIG
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\nstep:1 - timing_s/step:1.0\n")
    assert read_job_config_file(path) == CONFIG
    flat = flatten(CONFIG)
    assert flat["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] is True
    assert flat["actor_rollout_ref.model.override_config"] == {}
    assert flat["trainer.logger"] == ["console"]


def test_a_line_of_only_a_comma_goes_on_with_the_config(tmp_path):
    """verl 0.9's V1 trainer under Ray: an entry's value ends one line and its comma is the
    next line's only text; the entries after it (``trainer.v1``) are still read."""
    config = {"data": {"train_batch_size": 8},
              "trainer": {"nnodes": 1, "project_name": "demo",
                          "save_freq": 5, "use_v1": True,
                          "v1": {"separate_async": {"parameter_sync_step": 1},
                                 "trainer_mode": "separate_async"}}}
    lines = _printed(config)
    at = next(i for i, line in enumerate(lines) if "'project_name': 'demo'," in line)
    lines[at:at + 1] = [lines[at].replace("'demo',", "'demo'"), PREFIX + ","]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    got = read_job_config_file(path)
    assert got == config
    assert flatten(got or {})["trainer.v1.trainer_mode"] == "separate_async"


def test_a_config_cut_short_keeps_what_was_printed():
    lines = _printed(CONFIG)
    cut = lines[:7] + [lines[7][:70] + "..."]  # a logger cut the print off mid-line
    got = flatten(read_job_config(cut) or {})
    assert got["actor_rollout_ref.actor.fsdp_config.param_offload"] is False
    assert "trainer.save_freq" not in got
    assert read_job_config([PREFIX + "no config here", PREFIX + "{'a': 1}"]) is None
    # values printed as ... are not known
    elided = read_job_config([PREFIX + "{'data': {'tokenizer': ..., 'train_batch_size': 32}, "
                                       "'trainer': {'logger': ['console'], ..."])
    assert flatten(elided or {}) == {"data.train_batch_size": 32, "trainer.logger": ["console"]}


def test_advice_never_sets_a_knob_to_the_value_the_job_already_has():
    """issue 28: a real run with only optimizer_offload=True was told to set param_offload=False
    too, which it already was."""
    flat = flatten(CONFIG)
    offload = cause_advice("update_actor", "pcie_bound")[0]
    told = with_job_config(offload, flat)
    assert told is not None
    assert "param_offload=False" not in told
    assert "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False" in told
    assert "param_offload is already False" in told and "optimizer_offload is True" in told
    # a knob the job sets is named with its value
    update = cause_advice("update_actor", None)[0]
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (4 in this job)" in \
        with_job_config(update, flat)
    # a sentence that only asks for what is already so is left out
    both_off = {**flat, "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False}
    assert with_job_config(offload, both_off) is None
    assert advice_with_job_config([offload, update], both_off)[0].startswith("The actor update")
    # without a config nothing changes
    assert advice_with_job_config([offload], None) == [offload]


def test_the_scan_ends_at_the_first_step_when_no_config_came_before_it(tmp_path):
    from monitor.logs.job_config import scan_job_config_file

    path = tmp_path / "train.log"
    path.write_text(PREFIX + "starting\n")
    assert scan_job_config_file(path) == (None, False)  # the config may still be printed
    with path.open("a") as fh:
        fh.write(PREFIX + "step:1 - timing_s/step:2.0 - actor/lr:1e-06\n")
    assert scan_job_config_file(path) == (None, True)  # a step first: none will follow
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"step": 1, "data": {"timing_s/step": 2.0}}\n')
    assert scan_job_config_file(jsonl) == (None, True)
    assert scan_job_config_file(tmp_path / "missing.log") == (None, False)


def test_a_sentence_that_also_names_a_knob_to_turn_is_kept_with_its_value():
    """A real V1 separate-async run (verl 0.9) already synced over NCCL with
    parameter_sync_step 1: its weight_sync_pause advice had no line left at all. What is set
    is left out; what can still be turned stays, with the job's value."""
    flat = {"actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
            "trainer.v1.separate_async.parameter_sync_step": 1}
    both = ("Sync over NCCL (actor_rollout_ref.rollout.checkpoint_engine.backend=nccl) and less "
            "often (trainer.v1.separate_async.parameter_sync_step).")
    told = with_job_config(both, flat)
    assert told is not None
    assert "trainer.v1.separate_async.parameter_sync_step (1 in this job)" in told
    assert "backend is already 'nccl'" in told
    advice = advice_with_job_config(ADVICE["weight_sync_pause"], flat)
    assert len(advice) == 1 and advice[0].startswith("Sync less often")
    assert "parameter_sync_step (1 in this job)" in advice[0]


def test_exception_advice_names_real_keys_only():
    for _, _, sentences in EXCEPTION_ADVICE:
        for sentence in sentences:
            for key in named_keys(sentence):
                assert key in REAL_KEYS, key


# --- issue 37 item 3 and issue 41 item 6: the config through the noise, the driver's, masked --

V1_CONFIG = {
    "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                          "rollout": {"name": "vllm", "n": 8}},
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 64, "dataloader_num_workers": 8},
    "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {
        "WANDB_API_KEY": "abc123secret", "HF_TOKEN": "hf_xyz",
        "RM_URL": "http://user:hunter2@rm.internal:8000/score"}}}},
    "trainer": {"use_v1": True, "v1": {"trainer_mode": "separate_async"},
                "n_gpus_per_node": 8, "nnodes": 2},
}
_RAY_WARNING = [
    "\x1b[33m(raylet)\x1b[0m [2026-08-20 10:00:01,000 W 811 811] (raylet) A worker died or "
    "was killed while executing a task by an unexpected system error.",
    "\x1b[36m(WorkerDict pid=3007)\x1b[0m /usr/lib/python3/site-packages/torch/cuda.py:12: "
    "UserWarning: TF32 is on",
    "\x1b[36m(WorkerDict pid=3007)\x1b[0m   warnings.warn(",
    "2026-08-20 10:00:02,100\tWARNING worker.py:2301 -- Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/ray/_private/worker.py", line 844, in get',
    "    raise value",
] + [f"(pid=40{n:02d}) deprecation warning line {n}" for n in range(14)]


def test_another_processs_warning_inside_the_dump_does_not_end_it(tmp_path):
    """Ray prints another process's 20-line warning (other actors, the raylet, unprefixed
    lines, a traceback's indented frames) in the middle of the driver's config dump: the
    reader goes on to the end, so the trainer section (the V1 mode) is read (issue 37)."""
    from monitor.logs.modes import printed_mode

    lines = _printed(V1_CONFIG)
    mid = len(lines) // 2
    noisy = lines[:mid] + _RAY_WARNING + lines[mid:]
    path = tmp_path / "train.log"
    path.write_text("\n".join(noisy) + "\nstep:1 - timing_s/step:1.0\n")
    got = read_job_config_file(path)
    assert got is not None and set(got) == set(V1_CONFIG)
    assert printed_mode(got) == "separate_async"


def test_a_config_read_in_part_says_which_sections_it_has(tmp_path, capsys):
    """A dump cut short by the logger: what was printed is kept, and analyze says which
    sections it has and that the rest is not known."""
    from monitor.cli import main
    from monitor.logs.job_config import describe_file

    lines = _printed(V1_CONFIG)
    cut = next(n for n, ln in enumerate(lines) if "'data'" in ln) + 1
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines[:cut] + [PREFIX + "  ...",
                                             "step:1 - timing_s/step:2.0 - timing_s/gen:1.0"])
                    + "\n")
    info = describe_file(path)
    assert info["found"] and not info["whole"]
    assert "actor_rollout_ref" in info["sections"] and "trainer" not in info["sections"]
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "printed config: read in part: it has actor_rollout_ref, algorithm" in out


def test_only_the_drivers_dict_is_the_jobs_config():
    """A dict another actor prints, or an unprefixed dict with one section name, is not the
    job's config (issue 41: any dict opening with a section name was taken)."""
    worker = ["(WorkerDict pid=3007) {'data': {'train_batch_size': 1}, 'trainer': {'x': 1}}"]
    assert read_job_config(worker) is None
    assert read_job_config(["{'data': {'train_batch_size': 1}}"]) is None
    whole = [line[len(PREFIX):] for line in _printed(CONFIG)]
    assert read_job_config(whole) == CONFIG  # no prefix at all: several sections suffice


def test_secrets_in_the_printed_config_are_masked():
    """API keys, tokens and a URL's password are masked as the config is read, so the store's
    meta, export and wandb never hold them (issue 41)."""
    got = read_job_config(_printed(V1_CONFIG))
    env = got["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env["WANDB_API_KEY"] == "***" and env["HF_TOKEN"] == "***"
    assert env["RM_URL"] == "http://user:***@rm.internal:8000/score"
    assert got["data"]["train_batch_size"] == 64  # everything else as printed


def test_a_print_that_is_no_config_is_given_up_within_bounds():
    """200 KB of nested brackets took 5 GB; an unclosed dump with a value that is no literal
    froze the live detectors (issue 41). Both are now given up or cut at once."""
    import time as _time

    deep = [PREFIX + "{'actor_rollout_ref': " + "[" * 200_000]
    t0 = _time.process_time()
    assert read_job_config(deep) is None
    lines = _printed(CONFIG)
    bad = lines[:3] + [PREFIX + "  'x': <object at 0x7f>,"] + [
        PREFIX + f"  'k{n}': {n}," for n in range(20_000)]
    got = read_job_config(bad)
    assert got is not None and "actor_rollout_ref" in got  # read up to the bad value
    assert _time.process_time() - t0 < 60  # a generous bound: before, it did not return


def test_a_line_of_the_dump_with_another_write_glued_on_keeps_only_its_own_text():
    """Ray's stream glued a stderr warning onto a line of the dump (``'max_num_seqs': None,``
    then ``(TaskRunnerV1 pid=N) /usr/...: DeprecationWarning``): the config was read only up
    to there (its trainer section lost, the V1 mode read as sync); now all of it is read."""
    from monitor.logs.modes import printed_mode

    lines = _printed(V1_CONFIG)
    mid = len(lines) // 2
    lines[mid] += ("\x1b[36m(TaskRunnerV1 pid=13158)\x1b[0m /usr/lib/python3/ray/_private/"
                   "auto_init_hook.py:22: DeprecationWarning: ...")
    got = read_job_config(lines)
    assert got is not None and set(got) == set(V1_CONFIG)
    assert printed_mode(got) == "separate_async"
