"""The lines a raised exception prints are recognised on their own; warnings and a reward
function's own "Error: ..." prints are not exceptions."""

from __future__ import annotations

import pytest

from monitor.logs.exception_lines import exception_line, is_frame_line


@pytest.mark.parametrize(("line", "name", "message"), [
    ("ValueError: Prompt length of 700 is longer than the maximum model length of 640.",
     "ValueError", "Prompt length of 700 is longer than the maximum model length of 640."),
    ("omegaconf.errors.ConfigAttributeError: Key 'use_fancy_mode' is not in struct",
     "ConfigAttributeError", "Key 'use_fancy_mode' is not in struct"),
    ("ray.exceptions.RayTaskError(FileNotFoundError): ray::TaskRunner.run() (pid=9, ip=1.2.3.4)",
     "FileNotFoundError", "ray::TaskRunner.run() (pid=9, ip=1.2.3.4)"),
    ("AssertionError", "AssertionError", ""),
    ("jinja2.exceptions.TemplateError: Conversation roles must alternate",
     "TemplateError", "Conversation roles must alternate"),
    ("KeyboardInterrupt", "KeyboardInterrupt", ""),
    ("Exception: boom", "Exception", "boom"),
])
def test_an_exceptions_line_gives_its_class_and_message(line: str, name: str,
                                                       message: str) -> None:
    found = exception_line(line)
    assert found is not None and found.typed
    assert (found.name, found.message) == (name, message)


@pytest.mark.parametrize(("line", "implied"), [
    ("Key 'sampler' is not in struct, full_key: trainer.sampler", "ConfigAttributeError"),
    ("Key 'use_magic' not in 'ActorConfig'", "ConfigKeyError"),
    ("xformers/_C.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationESs", "ImportError"),
    ("'_OpNamespace' '_C' object has no attribute 'fused_add_rms_norm'", "AttributeError"),
    ("Input prompt (9001 tokens) is too long and exceeds limit of 8192", "ValueError"),
    ("ckpts/global_step_7/critic/fsdp_config.json does not exist.", "FileNotFoundError"),
])
def test_a_message_quoted_without_its_type_is_still_an_exception(line: str,
                                                                 implied: str) -> None:
    found = exception_line(line)
    assert found is not None and not found.typed
    assert found.type == implied and found.message == line


@pytest.mark.parametrize("line", [
    "RuntimeWarning: Failed to read commit hash:",
    "No module named 'vllm._version'",
    "Error: <answer> tag not found.",
    "Checkpoint tracker file does not exist: /ckpt/latest_checkpointed_iteration.txt",
    "UserWarning: TypedStorage is deprecated",
    "step:3 - actor/pg_loss:0.1",
    "Error executing job with overrides: ['data.train_batch_size=8']",
    "",
])
def test_other_lines_are_not_exceptions(line: str) -> None:
    assert exception_line(line) is None


def test_frame_lines_with_or_without_their_indent() -> None:
    assert is_frame_line('  File "/srv/verl/verl/trainer/main_ppo.py", line 12, in main')
    assert is_frame_line('File "<frozen importlib._bootstrap>", line 1030, in _gcd_import')
    assert not is_frame_line('File "x.py", line 3 in f')  # faulthandler's dump, no comma
    assert not is_frame_line("    run_ppo(config)")
