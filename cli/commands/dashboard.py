"""``verl-monitor dashboard``: start the Streamlit app on a run store or a Prometheus server.

Runs ``python -m streamlit run dashboards/app.py`` headless, without usage statistics, and
passes the source to the app through the environment (``VERLMON_STORE``,
``VERLMON_PROMETHEUS``, ``VERLMON_JOB``, ``VERLMON_PROMETHEUS_TIMEOUT``). Ctrl-C stops the app
and exits 0. A ``--prometheus`` value that is not an http(s) URL is one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from cli.children import stop_process
from cli.errors import FAILED, CommandError, exits, fail_if
from monitor.urls import redact

DEFAULT_PORT = 8501
DEFAULT_ADDRESS = "127.0.0.1"


def app_path() -> Path:
    """The packaged app script (``dashboards/app.py``)."""
    spec = importlib.util.find_spec("dashboards")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the dashboards package is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "app.py"


def streamlit_command(port: int, address: str) -> list[str]:
    """The command line that serves the app headless on ``address:port``."""
    return [
        sys.executable, "-m", "streamlit", "run", str(app_path()),
        "--server.headless", "true",
        "--server.port", str(port),
        "--server.address", address,
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--client.toolbarMode", "viewer",
    ]


def source_env(store: str | None = None, prometheus: str | None = None,
               job: str | None = None, timeout: float | None = None) -> dict[str, str]:
    """The environment that tells the app which source to read (``timeout``: the deadline of
    one Prometheus query, whole answer included)."""
    env = dict(os.environ)
    for name in ("VERLMON_STORE", "VERLMON_PROMETHEUS", "VERLMON_JOB"):
        env.pop(name, None)
    if prometheus:
        env["VERLMON_PROMETHEUS"] = prometheus
        if job:
            env["VERLMON_JOB"] = job
        if timeout:
            env["VERLMON_PROMETHEUS_TIMEOUT"] = f"{timeout:g}"
    elif store:
        env["VERLMON_STORE"] = str(Path(store).resolve())
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    return env


def start_dashboard(port: int, address: str, store: str | None = None,
                    prometheus: str | None = None, job: str | None = None,
                    quiet: bool = True, timeout: float | None = None) -> subprocess.Popen:
    """Start the app in a child process (its output discarded when ``quiet``)."""
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(streamlit_command(port, address),
                            env=source_env(store, prometheus, job, timeout),
                            stdout=out, stderr=subprocess.STDOUT if quiet else None)


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> bool:
    """Poll ``URL/_stcore/health`` until it answers ok (False on timeout or child exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=1) as resp:
                if resp.read().strip() == b"ok":
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def display_url(address: str, port: int) -> str:
    """The URL to print ("0.0.0.0" becomes "localhost")."""
    host = "localhost" if address in ("0.0.0.0", "::", "") else address
    return f"http://{host}:{port}"


def check_store(path: str) -> str | None:
    """None when ``path`` is a readable run store, else the one-line reason."""
    from monitor.store.runstore import RunStore, StoreError

    p = Path(path)
    if not p.exists():
        return f"{p}: no such run store (start the exporter with --store {p}, or pass --wait)"
    if not p.is_file():
        return f"{p}: not a file"
    try:
        RunStore(p, create=False).close()
    except StoreError as exc:
        return str(exc)
    except OSError as exc:
        return f"{p}: cannot read ({exc})"
    return None


def prometheus_problem(url: str | None, timeout: float | None = None) -> str | None:
    """None when ``--prometheus`` (if given) is an http(s) URL and ``--prometheus-timeout`` a
    positive number of seconds, else the one-line reason."""
    import math

    from dashboards.sources.prometheus import url_problem

    if url is not None:
        problem = url_problem(url)
        if problem:
            return f"--prometheus {redact(url)!r}: {problem}"
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        return f"--prometheus-timeout {timeout:g}: must be a positive number of seconds"
    return None


def port_problem(address: str, port: int) -> str | None:
    """None when ``address:port`` can be bound now, else the one-line reason (another program
    already listens there, or the address is not this machine's)."""
    import errno
    import socket

    host = "0.0.0.0" if address in ("", "::") else address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"cannot bind {address}:{port}: {exc.strerror or exc}"
    family, _type, _proto, _name, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"port {port} on {address} is already in use by another program "
                        f"(choose another with --port, or stop what serves {display_url(address, port)})")
            return f"cannot bind {address}:{port}: {exc.strerror or exc}"
    return None


def port_check(address: str, port: int, what: str = "") -> str | None:
    """One line when ``port`` cannot be served on ``address`` (out of range, or taken; the
    latter prefixed with ``what``), else None."""
    if not 0 < port < 65536:
        return f"bad --port {port}"
    busy = port_problem(address, port)
    return f"{what}{busy}" if busy else None


def interrupt_on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM handler: stop like Ctrl-C (children are then terminated in ``finally``)."""
    raise KeyboardInterrupt


#: How ``verl-monitor dashboard`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "start the live Streamlit dashboard on a run store or Prometheus",
    "description": ("Serve the verl-monitor dashboard (Overview, GPUs, Steps & phases, "
        "Communication, Rollout, Flags, Nodes, Job). Reads a local run store written by the "
        "exporter, or a Prometheus server scraping the exporters."),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``verl-monitor dashboard``."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", metavar="PATH",
                     help="run store (SQLite) written by `verl-monitor exporter --store`")
    src.add_argument("--prometheus", metavar="URL",
                     help="Prometheus base URL, e.g. http://localhost:9090 (USER:PASS@ in it "
                     "is sent as basic authentication and shown nowhere)")
    parser.add_argument("--job", metavar="NAME",
                        help="with --prometheus: only read this scrape job (default: all)")
    parser.add_argument("--prometheus-timeout", type=float, metavar="SECONDS",
                        help="with --prometheus: the deadline of one query, whole answer "
                        "included (default 10); past it the page says so and asks again "
                        "after as long")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to serve the app on (default {DEFAULT_PORT})")
    parser.add_argument("--address", default=DEFAULT_ADDRESS,
                        help=f"address to bind (default {DEFAULT_ADDRESS}; 0.0.0.0 for all)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML overriding thresholds, as given to the exporter and "
                        "analyze: the goodput ledger and the GPU-time bar use its goodput: "
                        "section (default: the config the exporter saved in --store, else "
                        "the built-in one)")
    parser.add_argument("--wait", action="store_true",
                        help="start even if the store does not exist yet (the app shows "
                        "'store missing' until the exporter creates it)")


@exits("dashboard")
def run(args: argparse.Namespace) -> int:
    """Serve the app until Ctrl-C; 0 on a clean stop, 2 on bad input, 1 if it fails."""
    from monitor.extras import explain_missing

    fail_if(explain_missing("dashboard", "the dashboard"))
    if args.store and not (args.wait and not Path(args.store).exists()):
        fail_if(check_store(args.store))
    fail_if(prometheus_problem(args.prometheus, args.prometheus_timeout))
    if getattr(args, "config", None):
        from monitor.config import ConfigError, load_config

        try:
            load_config(args.config)
        except ConfigError as exc:
            raise CommandError(f"--config {exc}") from exc
        os.environ["VERLMON_CONFIG"] = str(Path(args.config).resolve())  # read by the app
    fail_if(port_check(args.address, args.port))
    proc = start_dashboard(args.port, args.address, args.store, args.prometheus, args.job,
                           timeout=args.prometheus_timeout)
    url = display_url(args.address, args.port)
    previous = signal.signal(signal.SIGTERM, interrupt_on_signal)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})  # inherited masks
    try:
        if not wait_healthy(f"http://127.0.0.1:{args.port}" if args.address in
                            ("0.0.0.0", "::") else url, proc):
            why = port_problem(args.address, args.port) or (
                f"Streamlit exited with status {proc.poll()}" if proc.poll() is not None
                else "no answer from /_stcore/health within 60 s")
            raise CommandError(f"the app did not start on {url}: {why}", FAILED)
        source = redact(args.prometheus) if args.prometheus else str(Path(args.store).resolve())
        print(f"verl-monitor dashboard: serving {url} (source {source}); Ctrl-C stops",
              flush=True)
        return 0 if proc.wait() in (0, -signal.SIGTERM, -signal.SIGINT) else 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_process(proc)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
