"""The dashboard's Prometheus source against servers that misbehave (issue 20): JSON of the
wrong shape, a multi-line error, HTML, an answer dripped one byte at a time, no answer at all.
Every call the pages make ends with one SourceError line (or a failed status), never another
exception and never a hang. Real HTTP servers on 127.0.0.1 (``tests/bad_prometheus.py``)."""

from __future__ import annotations

import threading
import time

import pytest
from bad_prometheus import SHAPES, BadPrometheus

from dashboards.sources import SourceError
from dashboards.sources.prometheus import (
    DEFAULT_TIMEOUT_S,
    TIMEOUT_ENV,
    PrometheusSource,
    default_timeout,
    url_problem,
)

NOW = time.time()
#: every call a dashboard page makes, with arguments
CALLS = {
    "time_range": lambda s: s.time_range(),
    "nodes": lambda s: s.nodes(),
    "gpu_frame": lambda s: s.gpu_frame(NOW - 3600, NOW),
    "host_frame": lambda s: s.host_frame(NOW - 3600, NOW),
    "steps": lambda s: s.steps(NOW - 3600, NOW),
    "flags": lambda s: s.flags(),
    "nccl_frame": lambda s: s.nccl_frame(NOW - 3600, NOW),
    "node_summary": lambda s: s.node_summary(NOW - 3600, NOW),
    "node_frame": lambda s: s.node_frame(NOW - 3600, NOW),
    "fleet_frame": lambda s: s.fleet_frame(NOW - 3600, NOW),
}


def finishes(fn, wait_s: float = 60.0):
    """Run ``fn`` on a thread; its result or exception, or fail if it is still running after
    ``wait_s`` (a hang: the answer under test is dripped for two minutes)."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    assert not thread.is_alive(), "the call is still waiting on the server"
    return out


def one_line(exc: BaseException, url: str) -> str:
    assert isinstance(exc, SourceError), f"{exc.__class__.__name__}: {exc}"
    text = str(exc)
    assert "\n" not in text and text.strip() == text and url in text or "query failed" in text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("mode", [*SHAPES, "html"])
def test_wrong_answers_give_one_line_from_every_call(mode: str) -> None:
    with BadPrometheus(mode) as server:
        src = PrometheusSource(server.url, timeout=5.0)
        try:
            status = src.status()
            assert status.ok is False and "\n" not in status.message
            for name, call in CALLS.items():
                out = finishes(lambda call=call: call(src))
                assert "error" in out, f"{name} returned {out.get('value')!r}"
                text = one_line(out["error"], server.url)
                if mode in ("html", "list"):
                    assert ("without JSON" if mode == "html" else "not a JSON object") in text
                elif mode == "error-lines":
                    assert text == "Prometheus query failed: parse error:"
                else:
                    assert "shape verl-monitor cannot read" in text, (name, text)
        finally:
            src.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drip", "hang"])
def test_a_slow_or_silent_server_ends_at_the_deadline(mode: str) -> None:
    """Before: a drip kept resetting httpx's per-read timeout: the call (and the page) never
    ended. The deadline covers the whole answer; then the next queries fail at once."""
    with BadPrometheus(mode) as server:
        src = PrometheusSource(server.url, timeout=1.5)
        try:
            out = finishes(src.nodes)
            text = one_line(out["error"], server.url)
            assert "did not answer within 1.5 s" in text
            asked = server.requests
            out = finishes(lambda: src.gpu_frame(NOW - 600, NOW))
            assert str(out["error"]) == text and server.requests == asked  # not asked again
            assert src.status().message == text
        finally:
            src.close()


@pytest.mark.slow
def test_after_the_pause_the_server_is_asked_again() -> None:
    with BadPrometheus("hang") as server:
        src = PrometheusSource(server.url, timeout=0.5)
        try:
            assert "error" in finishes(src.nodes)
            asked = server.requests
            time.sleep(0.6)  # the pause after a late answer is one timeout long
            assert "error" in finishes(src.nodes)
            assert server.requests > asked
        finally:
            src.close()


@pytest.mark.parametrize("url", ["notaurl", "localhost:9090", "http://", "ftp://host:9090",
                                 "http://host:port"])
def test_a_url_that_is_not_http_is_refused_in_one_line(url: str) -> None:
    assert url_problem(url)
    with pytest.raises(SourceError) as refused:
        PrometheusSource(url)
    assert "\n" not in str(refused.value) and repr(url) in str(refused.value)


def test_good_urls_pass() -> None:
    for url in ("http://localhost:9090", "https://prom.example.org/prometheus/", " http://h:1 "):
        assert url_problem(url) is None


def test_the_deadline_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert default_timeout() == 2.5
    assert PrometheusSource("http://127.0.0.1:9").timeout == 2.5
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        assert default_timeout() == DEFAULT_TIMEOUT_S
