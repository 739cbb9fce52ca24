"""A simulated rollout engine: a vLLM or SGLang ``/metrics`` endpoint on 127.0.0.1.

verl's server-mode rollout runs vLLM or SGLang HTTP servers behind its agent loop; each serves
Prometheus metrics. :class:`EngineServer` serves the same exposition text, with the engines'
own metric names, types and labels, from a small :class:`EngineState` the caller changes
(``update``) or lets run (``advance``: tokens, requests and preemptions accrue over time). The
rollout-engine collector's tests, its benchmark and the simulator drive it.

Names, types and labels, read from the engines' sources:

- vLLM V1 (``vllm/v1/metrics/loggers.py``, 0.10-0.11+): labels ``model_name``, ``engine``
  (engine-core index); gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (0..1 despite the name: "1 means 100 percent usage"; before 0.9
  ``vllm:gpu_cache_usage_perc``, kept deprecated since), ``vllm:engine_sleep_state`` (extra
  label ``sleep_state``: ``awake`` 1 while awake, ``weights_offloaded`` 1 at sleep level 1,
  ``discard_all`` 1 at level 2; 0.11+); counters ``vllm:num_preemptions``,
  ``vllm:prompt_tokens``, ``vllm:generation_tokens``, ``vllm:request_success``
  (+ ``finished_reason``); histograms ``vllm:request_queue_time_seconds``,
  ``vllm:e2e_request_latency_seconds``.
- SGLang (``python/sglang/srt/metrics/collector.py``): scheduler labels ``model_name``,
  ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``; gauges ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:token_usage`` (0..1), ``sglang:num_paused_reqs``
  (requests paused by an async weight sync), ``sglang:num_retracted_reqs`` (older: retractions
  of the last interval); counters ``sglang:num_retracted_requests_total`` (retractions are
  SGLang's preemptions), ``sglang:generation_tokens_total``, ``sglang:prompt_tokens_total``
  (tokenizer labels: ``model_name``); histograms ``sglang:queue_time_seconds``,
  ``sglang:e2e_request_latency_seconds``.

Failure modes for tests: ``mode`` ``"ok"``, ``"garbage"`` (200 with text that is not the
exposition format), ``"error"`` (HTTP 500), ``"slow"`` (answers after ``delay_s``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

ENGINES = ("vllm", "sglang")
MODES = ("ok", "garbage", "error", "slow")

#: Latency buckets (seconds): vLLM's request latency buckets.
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


#: vLLM's other per-request histograms (loggers.py), rendered so an answer is as large as a
#: real one (about 25 histograms per engine core); the collector must skip them cheaply.
_VLLM_OTHER_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request."),
    ("vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request."),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:request_generation_tokens", "Number of generation tokens processed."),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    ("vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens."),
    ("vllm:request_params_n", "Histogram of the n request parameter."),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."),
)


@dataclass
class EngineState:
    """What the simulated engine reports; counters are cumulative (as the engine's are).

    ``kv_cache_usage`` 0..1; ``sleep_level`` 0 awake, 1 or 2 asleep (vLLM sleep levels);
    ``legacy`` renders a vLLM before 0.9 (``vllm:gpu_cache_usage_perc`` only, no sleep state)
    or an SGLang before the retraction counter (the ``num_retracted_reqs`` gauge only)."""

    kv_cache_usage: float = 0.3
    running: int = 16
    waiting: int = 0
    paused: int = 0
    preemptions: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests_finished: float = 0.0
    queue_time_sum: float = 0.0
    e2e_latency_sum: float = 0.0
    sleep_level: int = 0
    legacy: bool = False
    #: rates used by ``advance`` (per second)
    tokens_per_s: float = 2000.0
    requests_per_s: float = 2.0
    preemptions_per_s: float = 0.0
    queue_time_s: float = 0.05
    e2e_latency_s: float = 8.0


@dataclass
class _Served:
    engine: str
    model: str
    state: EngineState
    mode: str = "ok"
    delay_s: float = 0.0
    engines: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def _hist(name: str, doc: str, labels: list[str], values: list[str], count: float,
          total: float, typical: float) -> HistogramMetricFamily:
    """A histogram whose observations all sit at ``typical`` (enough for sum/count readers)."""
    fam = HistogramMetricFamily(name, doc, labels=labels)
    buckets = []
    for le in _LATENCY_BUCKETS:
        buckets.append((repr(float(le)), count if typical <= le else 0.0))
    buckets.append(("+Inf", count))
    fam.add_metric(values, buckets=buckets, sum_value=total)
    return fam


def render_vllm(state: EngineState, model: str, engines: int = 1) -> list:
    """vLLM V1's families for ``state`` (split evenly over ``engines`` engine cores)."""
    labels = ["model_name", "engine"]
    fams: list = []

    def gauge(name: str, doc: str, value: float, per_engine: bool = True) -> None:
        fam = GaugeMetricFamily(name, doc, labels=labels)
        for i in range(engines):
            fam.add_metric([model, str(i)], value / engines if per_engine else value)
        fams.append(fam)

    def counter(name: str, doc: str, value: float) -> None:
        fam = CounterMetricFamily(name, doc, labels=labels)
        for i in range(engines):
            fam.add_metric([model, str(i)], value / engines)
        fams.append(fam)

    gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          state.running)
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          state.waiting)
    gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
          "DEPRECATED: Use vllm:kv_cache_usage_perc instead.", state.kv_cache_usage,
          per_engine=False)
    if not state.legacy:
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
              state.kv_cache_usage, per_engine=False)
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is "
            "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep "
            "level 1; discard_all = 1 means sleep level 2.", labels=labels + ["sleep_state"])
        for i in range(engines):
            for name, level in (("awake", 0), ("weights_offloaded", 1), ("discard_all", 2)):
                sleep.add_metric([model, str(i), name], 1.0 if state.sleep_level == level else 0.0)
        fams.append(sleep)
    counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            state.preemptions)
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", state.prompt_tokens)
    counter("vllm:generation_tokens", "Number of generation tokens processed.",
            state.generation_tokens)
    success = CounterMetricFamily("vllm:request_success",
                                  "Count of successfully processed requests.",
                                  labels=labels + ["finished_reason"])
    for i in range(engines):
        for reason, share in (("stop", 0.9), ("length", 0.1), ("abort", 0.0)):
            success.add_metric([model, str(i), reason], state.requests_finished * share / engines)
    fams.append(success)
    for name, doc in _VLLM_OTHER_HISTOGRAMS:  # what a real answer also holds (and is skipped)
        fam = None
        for i in range(engines):
            part = _hist(name, doc, labels, [model, str(i)], state.requests_finished / engines,
                         state.requests_finished / engines, 1.0)
            if fam is None:
                fam = part
            else:
                fam.samples.extend(part.samples)
        fams.append(fam)
    for name, doc, total, typical in (
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
         "request.", state.queue_time_sum, state.queue_time_s),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
         state.e2e_latency_sum, state.e2e_latency_s),
    ):
        fam = None
        for i in range(engines):
            part = _hist(name, doc, labels, [model, str(i)], state.requests_finished / engines,
                         total / engines, typical)
            if fam is None:
                fam = part
            else:
                fam.samples.extend(part.samples)
        fams.append(fam)
    return fams


def render_sglang(state: EngineState, model: str, engines: int = 1) -> list:
    """SGLang's families for ``state`` (``engines`` data-parallel ranks, as ``tp_rank``)."""
    sched = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
    tok = ["model_name"]
    fams: list = []

    def gauge(name: str, doc: str, value: float, per_rank: bool = True) -> None:
        fam = GaugeMetricFamily(name, doc, labels=sched)
        for i in range(engines):
            fam.add_metric([model, "unified", str(i), "0", "0"],
                           value / engines if per_rank else value)
        fams.append(fam)

    gauge("sglang:num_running_reqs", "The number of running requests.", state.running)
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", state.waiting)
    gauge("sglang:token_usage", "The token usage.", state.kv_cache_usage, per_rank=False)
    gauge("sglang:num_used_tokens", "The number of used tokens.", state.kv_cache_usage * 500_000)
    gauge("sglang:gen_throughput", "The generation throughput (token/s).", state.tokens_per_s)
    gauge("sglang:num_retracted_reqs", "The number of retracted requests.",
          state.preemptions_per_s * 5)
    if not state.legacy:
        gauge("sglang:num_paused_reqs", "The number of paused requests by async weight sync.",
              state.paused)
        fam = CounterMetricFamily("sglang:num_retracted_requests",
                                  "Total number of retracted requests.", labels=sched)
        for i in range(engines):
            fam.add_metric([model, "unified", str(i), "0", "0"], state.preemptions / engines)
        fams.append(fam)
    for name, doc, value in (
        ("sglang:prompt_tokens", "Number of prefill tokens processed.", state.prompt_tokens),
        ("sglang:generation_tokens", "Number of generation tokens processed.",
         state.generation_tokens),
        ("sglang:num_requests", "Number of requests processed.", state.requests_finished),
    ):
        fam = CounterMetricFamily(name, doc, labels=tok)
        fam.add_metric([model], value)
        fams.append(fam)
    fams.append(_hist("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                      sched[:1], [model], state.requests_finished, state.queue_time_sum,
                      state.queue_time_s))
    fams.append(_hist("sglang:e2e_request_latency_seconds",
                      "Histogram of End-to-end request latency in seconds", tok, [model],
                      state.requests_finished, state.e2e_latency_sum, state.e2e_latency_s))
    return fams


class _Registry:
    """A prometheus-client collector over one served engine (rendered fresh each scrape)."""

    def __init__(self, served: _Served, lock: threading.Lock) -> None:
        self.served = served
        self.lock = lock

    def collect(self):
        with self.lock:
            s = self.served
            state = replace(s.state)
        render = render_vllm if s.engine == "vllm" else render_sglang
        return render(state, s.model, s.engines)


def exposition(engine: str, state: EngineState, model: str = "Qwen/Qwen2.5-7B-Instruct",
               engines: int = 1) -> str:
    """The engine's ``/metrics`` text for ``state`` (what :class:`EngineServer` serves)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    registry = CollectorRegistry()
    registry.register(_Registry(_Served(engine, model, state, engines=engines),
                                threading.Lock()))
    return generate_latest(registry).decode()


class EngineServer:
    """A simulated vLLM / SGLang server answering ``GET /metrics`` on 127.0.0.1.

    ``start()`` binds (port 0: a free port) and serves on a daemon thread; ``url`` is the base
    address (``http://127.0.0.1:PORT``), the way verl lists its servers; ``stop()`` closes it.
    ``update(**fields)`` changes the state; ``set_mode`` makes it fail on purpose."""

    def __init__(self, engine: str = "vllm", model: str = "Qwen/Qwen2.5-7B-Instruct",
                 state: EngineState | None = None, host: str = "127.0.0.1", port: int = 0,
                 engines: int = 1) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        self._lock = threading.Lock()
        self._served = _Served(engine, model, state or EngineState(), engines=engines)
        self._registry = CollectorRegistry()
        self._registry.register(_Registry(self._served, self._lock))
        self._host, self._port = host, port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._last_advance = time.monotonic()
        self.scrapes = 0

    @property
    def engine(self) -> str:
        """``vllm`` or ``sglang``."""
        return self._served.engine

    @property
    def model(self) -> str:
        """The served model name (the ``model_name`` label)."""
        return self._served.model

    @property
    def state(self) -> EngineState:
        """A copy of the current state."""
        with self._lock:
            return replace(self._served.state)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (after ``start``)."""
        if self._httpd is None:
            raise RuntimeError("the engine server is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def address(self) -> str:
        """``HOST:PORT``, as verl writes its server addresses into the Prometheus config."""
        return self.url.removeprefix("http://")

    def update(self, **fields: Any) -> None:
        """Set state fields (``kv_cache_usage=0.99, waiting=40, preemptions_per_s=2``...)."""
        with self._lock:
            for key, value in fields.items():
                if not hasattr(self._served.state, key):
                    raise AttributeError(f"EngineState has no field {key!r}")
                setattr(self._served.state, key, value)

    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        """``ok``, ``garbage``, ``error`` (HTTP 500) or ``slow`` (answers after ``delay_s``)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        with self._lock:
            self._served.mode = mode
            self._served.delay_s = float(delay_s)

    def advance(self, seconds: float | None = None) -> None:
        """Let ``seconds`` (default: since the last call) of work accrue at the state's rates:
        generated and prompt tokens, finished requests with their queue and e2e time, and
        preemptions. Nothing accrues while the engine sleeps."""
        now = time.monotonic()
        dt = now - self._last_advance if seconds is None else float(seconds)
        self._last_advance = now
        with self._lock:
            st = self._served.state
            if st.sleep_level or dt <= 0:
                return
            done = st.requests_per_s * dt
            st.generation_tokens += st.tokens_per_s * dt
            st.prompt_tokens += st.tokens_per_s * dt * 0.25
            st.requests_finished += done
            st.queue_time_sum += done * st.queue_time_s
            st.e2e_latency_sum += done * st.e2e_latency_s
            st.preemptions += st.preemptions_per_s * dt

    def body(self) -> tuple[int, bytes]:
        """(status, body) of one ``/metrics`` answer in the current mode."""
        with self._lock:
            mode, delay = self._served.mode, self._served.delay_s
        if mode == "slow":
            time.sleep(delay)
        if mode == "error":
            return 500, b"Internal Server Error\n"
        if mode == "garbage":
            return 200, b"<html><body>502 Bad Gateway</body></html>\n{not: metrics}\n"
        return 200, generate_latest(self._registry)

    def start(self) -> EngineServer:
        """Bind and serve on a daemon thread; returns self."""
        if self._httpd is not None:
            return self
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's and SGLang's servers do

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                server.scrapes += 1
                status, body = server.body()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the scraper gave up (its timeout): nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer((self._host, self._port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name=f"sim-{self.engine}-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
