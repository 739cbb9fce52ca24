"""Issue 28 item 8: SGLang's ``sglang_`` names (some releases, and the answers relayed by its
router or an OpenTelemetry pipeline, spell ``sglang:num_running_reqs`` as
``sglang_num_running_reqs``) are read like the ``sglang:`` ones."""

from __future__ import annotations

import pytest

from exporters.collectors.rollout_engine import parse_exposition

MODEL = "Qwen/Qwen2.5-7B-Instruct"
LABELS = f'engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="0"'

#: The same numbers in both spellings, as prometheus-client writes them (HELP / TYPE lines,
#: ``_created`` samples of counters and histograms, a bucket) and as OpenMetrics (``# EOF``).
SGLANG_TEXT = """\
# HELP {p}num_running_reqs The number of running requests.
# TYPE {p}num_running_reqs gauge
{p}num_running_reqs{{{labels}}} 20.0
{p}num_running_reqs{{{labels1}}} 12.0
# HELP {p}num_queue_reqs The number of requests in the waiting queue.
# TYPE {p}num_queue_reqs gauge
{p}num_queue_reqs{{{labels}}} 6.0
# HELP {p}num_paused_reqs The number of paused requests by async weight sync.
# TYPE {p}num_paused_reqs gauge
{p}num_paused_reqs{{{labels}}} 4.0
# HELP {p}token_usage The token usage.
# TYPE {p}token_usage gauge
{p}token_usage{{{labels}}} 0.5
{p}token_usage{{{labels1}}} 0.75
# HELP {p}num_retracted_requests_total Total number of retracted requests.
# TYPE {p}num_retracted_requests_total counter
{p}num_retracted_requests_total{{{labels}}} 9.0
{p}num_retracted_requests_created{{{labels}}} 1.7649e+09
# HELP {p}generation_tokens_total Number of generation tokens processed.
# TYPE {p}generation_tokens_total counter
{p}generation_tokens_total{{{labels}}} 123456.0
# HELP {p}queue_time_seconds Histogram of queueing time in seconds.
# TYPE {p}queue_time_seconds histogram
{p}queue_time_seconds_bucket{{{labels},le="+Inf"}} 50.0
{p}queue_time_seconds_count{{{labels}}} 50.0
{p}queue_time_seconds_sum{{{labels}}} 25.0
# HELP {p}e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE {p}e2e_request_latency_seconds histogram
{p}e2e_request_latency_seconds_count{{{labels}}} 50.0
{p}e2e_request_latency_seconds_sum{{{labels}}} 400.0
"""


def text(prefix: str) -> str:
    return SGLANG_TEXT.format(p=prefix, labels=LABELS,
                              labels1=LABELS.replace('tp_rank="0"', 'tp_rank="1"'))


@pytest.mark.parametrize("tail", ["", "# EOF\n"], ids=["prometheus", "openmetrics"])
def test_underscore_names_read_like_colon_names(tail: str) -> None:
    """Before: the underscore answer was 'the answer holds no vLLM or SGLang metrics'."""
    colon = parse_exposition(text("sglang:"))
    underscore = parse_exposition(text("sglang_") + tail)
    assert underscore.engine == "sglang" and underscore.model == MODEL
    assert underscore.values == colon.values
    assert underscore.get("running") == 32.0 and underscore.get("kv_cache_usage") == 0.75
    assert underscore.get("waiting") == 6.0 and underscore.get("paused") == 4.0
    assert underscore.get("preemptions_total") == 9.0
    assert underscore.get("queue_time_sum") == 25.0 and underscore.get("e2e_latency_count") == 50
