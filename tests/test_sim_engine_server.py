"""The simulated vLLM / SGLang server: the engines' own metric names, types and labels over
real HTTP on 127.0.0.1, work that accrues with time, and the failure modes tests use."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.sim.engine_server import EngineServer, EngineState, exposition


def families(text: str) -> dict[str, tuple[str, list]]:
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def test_vllm_exposition_has_its_names_types_and_labels():
    fams = families(exposition("vllm", EngineState(kv_cache_usage=0.9), engines=2))
    assert fams["vllm:kv_cache_usage_perc"][0] == "gauge"
    assert fams["vllm:num_preemptions"][0] == "counter"
    assert fams["vllm:request_queue_time_seconds"][0] == "histogram"
    assert fams["vllm:e2e_request_latency_seconds"][0] == "histogram"
    running = fams["vllm:num_requests_running"][1]
    assert [s.labels for s in running] == [
        {"model_name": "Qwen/Qwen2.5-7B-Instruct", "engine": "0"},
        {"model_name": "Qwen/Qwen2.5-7B-Instruct", "engine": "1"}]
    assert {s.labels["sleep_state"] for s in fams["vllm:engine_sleep_state"][1]} == {
        "awake", "weights_offloaded", "discard_all"}
    assert all(s.value == 0.9 for s in fams["vllm:kv_cache_usage_perc"][1])  # 0..1


def test_sglang_and_legacy_expositions():
    fams = families(exposition("sglang", EngineState(paused=3)))
    assert fams["sglang:token_usage"][0] == "gauge"
    assert fams["sglang:num_retracted_requests"][0] == "counter"
    assert fams["sglang:num_paused_reqs"][1][0].value == 3
    assert set(fams["sglang:num_running_reqs"][1][0].labels) == {
        "model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
    old = families(exposition("vllm", EngineState(legacy=True)))
    assert "vllm:kv_cache_usage_perc" not in old and "vllm:gpu_cache_usage_perc" in old
    with pytest.raises(ValueError, match="engine must be one of"):
        exposition("tgi", EngineState())


def test_served_over_http_work_accrues_and_failure_modes():
    with EngineServer("vllm", state=EngineState(tokens_per_s=100.0, preemptions_per_s=1.0)
                      ) as srv:
        assert srv.url.startswith("http://127.0.0.1:") and srv.address in srv.url
        srv.advance(10.0)
        r = httpx.get(srv.url + "/metrics", timeout=5)
        assert r.status_code == 200
        fams = families(r.text)
        assert fams["vllm:generation_tokens"][1][0].value == 1000.0
        assert fams["vllm:num_preemptions"][1][0].value == 10.0
        srv.update(sleep_level=1)
        srv.advance(10.0)  # nothing accrues while asleep
        fams = families(httpx.get(srv.url + "/metrics", timeout=5).text)
        assert fams["vllm:generation_tokens"][1][0].value == 1000.0
        awake = [s for s in fams["vllm:engine_sleep_state"][1]
                 if s.labels["sleep_state"] == "awake"]
        assert awake[0].value == 0.0
        srv.set_mode("error")
        assert httpx.get(srv.url + "/metrics", timeout=5).status_code == 500
        srv.set_mode("garbage")
        assert "vllm:" not in httpx.get(srv.url + "/metrics", timeout=5).text
        assert httpx.get(srv.url + "/other", timeout=5).status_code == 404
        with pytest.raises(AttributeError):
            srv.update(no_such_field=1)
