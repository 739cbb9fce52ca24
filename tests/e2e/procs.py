"""Start real Prometheus, Alertmanager and a stand-in Slack webhook for end-to-end tests.

Every server gets a free port on 127.0.0.1 and its own directory; every wait is bounded and
fails with the process's log tail, so a test never hangs and says why it failed. Used by
``tests/e2e/test_alert_pipeline.py``; other e2e tests (e.g. Grafana panel queries) may reuse it::

    from procs import start_prometheus, wait_until

    with start_prometheus(tmp_path, scrape_targets=["127.0.0.1:8431"]) as prom:
        wait_until(lambda: prom.query("up") , timeout=30, what="first scrape")

Public API:

- ``free_port() -> int``: a port nobody listens on right now.
- ``wait_until(fn, timeout, interval=0.2, what="") -> value``: poll until ``fn()`` is truthy.
- ``stop_all(popens, timeout=30)``: SIGTERM many processes at once, then wait (SIGKILL late ones).
- ``Proc``: a started server (``url``, ``port``, ``log_path``, ``stop()``, ``log_tail()``,
  context manager). ``PrometheusProc`` adds ``query(expr)`` and ``alerts()``;
  ``AlertmanagerProc`` adds ``alerts()`` and ``post_alerts(alerts)``.
- ``prometheus_config(...) -> str``: a config with short intervals for tests.
- ``start_prometheus(workdir, config_text=None, ...) -> PrometheusProc``.
- ``start_alertmanager(workdir, config_path, ...) -> AlertmanagerProc``.
- ``repo_alertmanager_config(workdir, webhook_url, ...) -> Path``: the repository's
  ``prometheus/alertmanager/alertmanager.yml`` with the webhook URL file pointed at a test
  server and short grouping times.
- ``start_process(argv, workdir, name, ready_url, ...) -> Proc``: any other HTTP server.
- ``start_dashboard(cli, source, workdir, name) -> Proc``: ``verl-monitor dashboard`` on a
  free port, ready.
- ``WebhookRecorder``: an http.server on 127.0.0.1 recording JSON POST bodies (Slack's
  incoming webhook stand-in); ``url``, ``posts``, ``wait_for(predicate, timeout)``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

T = TypeVar("T")

PROMETHEUS_BIN = shutil.which("prometheus") or "prometheus"
ALERTMANAGER_BIN = (
    shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "alertmanager"
)
REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "prometheus" / "rules"
AM_DIR = REPO / "prometheus" / "alertmanager"

#: Skip marks of the browser and Prometheus e2e files (``make sysdeps`` installs both).
NEEDS_CHROMIUM = pytest.mark.skipif(
    not Path(os.environ.get("CHROMIUM", "/usr/bin/chromium")).exists(),
    reason="chromium not installed (make sysdeps)")
NEEDS_PROMETHEUS = pytest.mark.skipif(shutil.which("prometheus") is None,
                                      reason="prometheus not installed")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_all(popens: Sequence[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM every process first (they stop in parallel), then wait for each; SIGKILL one
    that is still running after ``timeout`` seconds."""
    for p in popens:
        if p.poll() is None:
            p.terminate()
    for p in popens:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout)


def wait_until(
    fn: Callable[[], T], timeout: float, interval: float = 0.2, what: str = "condition"
) -> T:
    """Call ``fn`` until it returns something truthy and return that; raise after ``timeout``.

    Exceptions raised by ``fn`` count as "not yet" (a server still starting); the last one is
    named in the TimeoutError.
    """
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:  # any failure means "not ready yet"
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


@dataclass
class Proc:
    """A server process started by this module, with its port and log file."""

    name: str
    popen: subprocess.Popen
    port: int
    workdir: Path
    log_path: Path

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's combined stdout/stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def stop(self, timeout: float = 10) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout``); idempotent."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_process(
    argv: Sequence[str],
    workdir: Path,
    name: str,
    port: int,
    ready_url: str | None,
    timeout: float = 30,
    env: dict[str, str] | None = None,
    proc_cls: type[Proc] = Proc,
) -> Proc:
    """Start ``argv`` in ``workdir`` logging to ``workdir/<name>.log``; wait for ``ready_url``.

    ``ready_url`` must answer 200 within ``timeout`` seconds, else the process is stopped and
    a RuntimeError carries its log tail. With ``ready_url=None`` the process is returned at once.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log = open(log_path, "ab")  # the child process keeps its own copy
    try:
        popen = subprocess.Popen(
            list(argv),
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    finally:
        log.close()
    proc = proc_cls(name=name, popen=popen, port=port, workdir=workdir, log_path=log_path)
    if ready_url is None:
        return proc

    def ready() -> str | None:
        if not proc.alive():
            return "exited"
        return "ready" if httpx.get(ready_url, timeout=2).status_code == 200 else None

    try:
        state = wait_until(ready, timeout, what=f"{name} at {ready_url}")
    except TimeoutError as exc:
        proc.stop()
        raise RuntimeError(
            f"{name} did not start: {exc}\n--- {log_path}\n{proc.log_tail()}"
        ) from exc
    if state == "exited":
        raise RuntimeError(
            f"{name} exited with status {popen.returncode}\n--- {log_path}\n{proc.log_tail()}"
        )
    return proc


class PrometheusProc(Proc):
    """A running Prometheus with small query helpers."""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the ``result`` list of the API answer (raises on an API error)."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        resp.raise_for_status()
        return resp.json()["data"]["result"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) as the API returns them."""
        resp = httpx.get(f"{self.url}/api/v1/alerts", timeout=5)
        resp.raise_for_status()
        return resp.json()["data"]["alerts"]


class AlertmanagerProc(Proc):
    """A running Alertmanager with helpers for its v2 API."""

    def alerts(self, **params: Any) -> list[dict[str, Any]]:
        """Alerts it holds (``GET /api/v2/alerts``; pass e.g. ``inhibited=False``)."""
        q = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
        resp = httpx.get(f"{self.url}/api/v2/alerts", params=q, timeout=5)
        resp.raise_for_status()
        return resp.json()

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Send alerts as Prometheus would (``POST /api/v2/alerts``)."""
        httpx.post(f"{self.url}/api/v2/alerts", json=alerts, timeout=5).raise_for_status()


def prometheus_config(
    scrape_targets: Sequence[str] = (),
    job: str = "verl-test",
    node: str = "node0",
    alertmanager: str | None = None,
    interval: str = "1s",
    rule_files: Sequence[Path] = (RULES_DIR / "recording.yml", RULES_DIR / "alerts.yml"),
) -> str:
    """A Prometheus config for tests: one scrape job with a ``node`` label, short intervals,
    the repository's rule files (absolute paths) and optionally one Alertmanager."""
    cfg: dict[str, Any] = {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "scrape_timeout": interval,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": list(scrape_targets), "labels": {"node": node}}],
            }
        ],
    }
    if alertmanager:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return yaml.safe_dump(cfg, sort_keys=False)


def start_dashboard(cli: str, source: Sequence[str], workdir: Path, name: str) -> Proc:
    """``verl-monitor dashboard`` with ``source`` (``--store PATH`` or ``--prometheus URL``
    ...) on a free port; returns once Streamlit answers its health check (``.url``)."""
    port = free_port()
    return start_process([cli, "dashboard", *source, "--port", str(port)], workdir, name, port,
                         f"http://127.0.0.1:{port}/_stcore/health", timeout=90)


def start_prometheus(
    workdir: Path,
    config_text: str | None = None,
    port: int | None = None,
    timeout: float = 30,
    **config_kwargs: Any,
) -> PrometheusProc:
    """Start Prometheus on a free port with its TSDB under ``workdir``.

    ``config_text`` is written to ``workdir/prometheus.yml``; without it, ``prometheus_config``
    builds one from ``config_kwargs``. Returns once ``/-/ready`` answers.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cfg = workdir / "prometheus.yml"
    cfg.write_text(config_text if config_text is not None else prometheus_config(**config_kwargs))
    argv = [
        PROMETHEUS_BIN,
        f"--config.file={cfg}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]
    proc = start_process(
        argv, workdir, "prometheus", port, f"http://127.0.0.1:{port}/-/ready", timeout,
        proc_cls=PrometheusProc,
    )
    assert isinstance(proc, PrometheusProc)
    return proc


def start_alertmanager(
    workdir: Path, config_path: Path, port: int | None = None, timeout: float = 30
) -> AlertmanagerProc:
    """Start Alertmanager (clustering off) on a free port with its data under ``workdir``."""
    port = port or free_port()
    argv = [
        ALERTMANAGER_BIN,
        f"--config.file={config_path}",
        f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    proc = start_process(
        argv, workdir, "alertmanager", port, f"http://127.0.0.1:{port}/-/ready", timeout,
        proc_cls=AlertmanagerProc,
    )
    assert isinstance(proc, AlertmanagerProc)
    return proc


def repo_alertmanager_config(
    workdir: Path,
    webhook_url: str,
    group_wait: str = "1s",
    group_interval: str = "1s",
    repeat_interval: str = "1h",
) -> Path:
    """Write the repository's Alertmanager config, adapted for a test, to ``workdir``.

    Only what a test must change is changed: the Slack webhook URL is written to a file in
    ``workdir`` (the config reads it with ``slack_api_url_file``, as in production), template
    paths become absolute, and every route's ``group_wait``/``group_interval``/
    ``repeat_interval`` is shortened. Routing, receivers, inhibition and templates stay as
    committed. Returns the path of the written config.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())
    url_file = workdir / "slack_webhook_url"
    url_file.write_text(webhook_url + "\n")
    cfg["global"]["slack_api_url_file"] = str(url_file)
    cfg["templates"] = [t if Path(t).is_absolute() else str(AM_DIR / t) for t in cfg["templates"]]

    def shorten(route: dict[str, Any]) -> None:
        for key, value in (
            ("group_wait", group_wait),
            ("group_interval", group_interval),
            ("repeat_interval", repeat_interval),
        ):
            if key in route or route is cfg["route"]:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(cfg["route"])
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@dataclass
class WebhookRecorder:
    """A local HTTP server that stands in for Slack's incoming webhook.

    Records every POST as ``{"path": ..., "body": <parsed JSON>}`` in ``posts`` and answers
    ``ok`` like Slack does. Use as a context manager (starts and stops the server thread).
    """

    posts: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """Base URL; any path under it is accepted (e.g. ``/services/T0/B0/x``)."""
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> WebhookRecorder:
        """Bind a free port and serve in a daemon thread."""
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    parsed: Any = json.loads(body)
                except ValueError:
                    parsed = body.decode(errors="replace")
                with recorder._lock:
                    recorder.posts.append({"path": self.path, "body": parsed})
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Shut the server down."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the posts received so far."""
        with self._lock:
            return list(self.posts)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str = "a post"
    ) -> dict[str, Any]:
        """The first recorded post whose body satisfies ``predicate``; bounded by ``timeout``."""

        def find() -> dict[str, Any] | None:
            return next((p for p in self.snapshot() if predicate(p["body"])), None)

        found = wait_until(find, timeout, what=what)
        assert found is not None
        return found

    def __enter__(self) -> WebhookRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
