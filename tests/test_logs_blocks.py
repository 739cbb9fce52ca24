"""Tracebacks as logs and quotes print them: without their header, behind a date prefix, with
Ray's wrapped exception after its RayTaskError line, with omegaconf's detail lines, caught and
logged by a logger; and a failure on a progress bar's line placed at the bar's count."""

from __future__ import annotations

from monitor.logs.canonical_records import LogParser
from monitor.records import Event


def _events(lines: list[str], kind: str | None = None) -> list[Event]:
    parser = LogParser()
    items = [item for line in lines for item in parser.feed(line)] + parser.flush()
    return [i for i in items if isinstance(i, Event) and (kind is None or i.kind == kind)]


def test_frames_without_the_header_are_a_traceback_ending_at_the_exception() -> None:
    (tb,) = _events([
        '  File "/srv/rl/verl/workers/fsdp_workers.py", line 700, in compute_log_prob',
        "    output = self.actor.compute_log_prob(data=data)",
        '  File "/srv/rl/verl/utils/torch_functional.py", line 150, in entropy_from_logits',
        "    entropy = torch.logsumexp(logits, dim=-1)",
        "ValueError: logits are empty",
    ], "traceback")
    assert tb.message == "ValueError: logits are empty"
    assert tb.data["headless"] is True
    assert tb.data["frame"] == "verl/utils/torch_functional.py:150 in entropy_from_logits"
    assert tb.data["code"] == "entropy = torch.logsumexp(logits, dim=-1)"
    assert tb.data["frames"][0] == "verl/workers/fsdp_workers.py:700 in compute_log_prob"


def test_headless_frames_followed_by_a_line_that_is_no_exception_are_not_one() -> None:
    """A worker's own print of a frame, then hydra's summary line: no exception was quoted."""
    events = _events([
        '(WorkerDict pid=3) File "/env/site-packages/torch/x.py", line 9, in unshard',
        "(WorkerDict pid=3)     self._check()",
        "Error executing job with overrides: ['a=1']",
    ], "traceback")
    assert events == []


def test_a_date_prefix_that_took_the_indent_keeps_frames_and_source_lines_apart() -> None:
    (tb,) = _events([
        "[2026-01-02 03:04:05] ray.exceptions.RayTaskError(KeyError): ray::TaskRunner.run() "
        "(pid=1, ip=10.0.0.1)",
        '[2026-01-02 03:04:05]   File "/srv/rl/verl/trainer/main_ppo.py", line 300, in run',
        "[2026-01-02 03:04:05]     trainer.fit()",
        '[2026-01-02 03:04:05]   File "/srv/rl/verl/trainer/ppo/ray_trainer.py", line 9, in fit',
        "[2026-01-02 03:04:05]     batch = self.lookup[key]",
        "[2026-01-02 03:04:05] KeyError: 'prompts'",
    ], "traceback")
    assert tb.message == "KeyError: 'prompts'"
    assert tb.data["exceptions"][0].startswith("ray.exceptions.RayTaskError(KeyError)")
    assert tb.data["code"] == "batch = self.lookup[key]"
    assert tb.data["task"] == "TaskRunner.run"


def test_ray_prints_the_wrapped_exception_after_its_line_and_omegaconf_its_detail() -> None:
    (tb,) = _events([
        "Traceback (most recent call last):",
        '  File "/srv/rl/verl/trainer/main_ppo.py", line 60, in run_ppo',
        "    ray.get(runner.run.remote(config))",
        "ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=2, ip=1.2.3.4)",
        "omegaconf.errors.ConfigKeyError: Missing key sampler",
        "    full_key: trainer.sampler",
        "    object_type=dict",
        "step:1 - timing_s/step:1.0",
    ], "traceback")
    assert tb.message == "omegaconf.errors.ConfigKeyError: Missing key sampler"
    assert len(tb.data["exceptions"]) == 2
    assert tb.data["detail"] == ["full_key: trainer.sampler", "object_type=dict"]


def test_an_exception_quoted_alone_is_a_traceback_event_with_its_detail() -> None:
    (tb,) = _events([
        "omegaconf.errors.ConfigAttributeError: Key 'fast_path' is not in struct",
        "    full_key: actor_rollout_ref.actor.fast_path",
    ], "traceback")
    assert tb.data["headless"] is True and tb.data["type"].endswith("ConfigAttributeError")
    assert tb.data["detail"] == ["full_key: actor_rollout_ref.actor.fast_path"]


def test_a_loggers_traceback_is_marked_caught_and_torchs_original_traceback_is_not() -> None:
    logged, original = _events([
        "ERROR:2026-03-01 10:00:00,000:Traceback (most recent call last):",
        '  File "/srv/app/env.py", line 10, in update',
        "TypeError: cannot unpack non-iterable NoneType object",
        "Original Traceback (most recent call last):",
        '  File "/env/site-packages/torch/utils/data/_utils/worker.py", line 300, in _loop',
        "ValueError: bad sample",
    ], "traceback")
    assert logged.data.get("logged") is True
    assert "logged" not in original.data


def test_a_failure_printed_on_a_progress_bars_line_is_placed_at_the_bars_count() -> None:
    """tqdm and another process share one line: the host OOM printed after the bar reading
    116/1155 is after step 116 (the log has no step line)."""
    events = _events([
        "Training Progress:  10%|█         | 116/1155 [1:02:03<9:16:45, 32.1s/it](raylet) "
        "(raylet) 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
        "crashed due to other reasons at node (ID: ab12, IP: 10.0.0.3) over the last time "
        "period.",
    ])
    (killed,) = [e for e in events if e.kind == "worker_killed"]
    assert killed.data["reason"] == "host_oom" and killed.step == 116


def test_a_traceback_after_a_bar_and_no_step_line_is_placed_at_the_bars_count() -> None:
    (tb,) = _events([
        "Training Progress:   2%|▏         | 7/300 [03:30<2:26:30, 30.0s/it]",
        "Traceback (most recent call last):",
        '  File "/srv/rl/verl/trainer/ppo/ray_trainer.py", line 900, in fit',
        "RuntimeError: reward server unreachable",
    ], "traceback")
    assert tb.step == 7
