"""``verl-monitor demo``: a simulated verl run, its exporter and the dashboard, in one command.

Starts ``verl-monitor exporter --gpu-backend sim --scenario demo`` (which plays the scripted
run into a log in real time, samples the simulated GPUs, follows the log, runs the detectors
and writes a run store), then the dashboard on that store (or on ``--prometheus URL``, which
the user points at the exporter). Prints both URLs; Ctrl-C stops everything and exits 0.
``--scenario agent_loop_demo`` / ``fully_async_demo`` play today's trainers: the exporter's
simulator then also serves one vLLM ``/metrics`` per engine server, which its rollout
collector scrapes (the dashboard's Rollout page).
"""

from __future__ import annotations

import argparse
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cli.commands.dashboard import (
    DEFAULT_ADDRESS,
    DEFAULT_PORT,
    display_url,
    interrupt_on_signal,
    port_check,
    port_problem,
    start_dashboard,
    stop_process,
    wait_healthy,
)
from cli.errors import FAILED, CommandError, exits, fail_if, warn
from monitor.urls import redact

_SERVING = re.compile(r"serving (\S+/metrics)")


def exporter_command(workdir: Path, scenario: str, speed: float, listen: str,
                     node: str) -> list[str]:
    """The exporter command line the demo runs (sim backend following its own log)."""
    # one sample per simulated second at any speed (0.1 s of wall time at 10x, the fastest
    # the exporter samples): a sped-up run is sampled as finely as at 1x
    interval = min(1.0, max(0.1, 1.0 / speed))
    log = workdir / "train.log"
    return [
        sys.executable, "-m", "monitor", "exporter",
        "--gpu-backend", "sim",
        "--scenario", scenario,
        "--sim-log", str(log),
        "--sim-speed", f"{speed:g}",
        "--log", str(log),
        "--store", str(workdir / "run.db"),
        "--listen-address", listen,
        "--interval", f"{interval:g}",
        "--node", node,
        "--nccl-dir", str(workdir / "nccl"),
        # the simulated engine servers (agent-loop and fully-async scenarios) change as fast as
        # the sped-up run: read them every sampling interval, not every 5 s
        "--rollout-interval", f"{max(interval, 0.5):g}",
    ]


def exporter_env(workdir: Path) -> dict[str, str]:
    """The exporter's environment: the simulated job dumps NCCL Inspector records into
    ``workdir/nccl``, which the exporter follows (``--nccl-dir``), so the Communication page
    has data too."""
    import os

    from monitor.sim.live import NCCL_DIR_ENV

    return {**os.environ, NCCL_DIR_ENV: str(workdir / "nccl")}


def start_exporter(cmd: list[str], timeout: float = 60.0,
                   env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start the exporter and wait for its startup line; returns (process, /metrics URL)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump(stream, sink: list[str] | None) -> None:
        for line in stream:
            if sink is None:
                lines.put(line)
            else:
                sink.append(line)
                del sink[:-20]
        if sink is None:
            lines.put(None)

    errors: list[str] = []
    threading.Thread(target=pump, args=(proc.stdout, None), daemon=True).start()
    threading.Thread(target=pump, args=(proc.stderr, errors), daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if line is None:
            break
        match = _SERVING.search(line)
        if match:
            threading.Thread(target=_drain, args=(lines,), daemon=True).start()
            return proc, match.group(1)
    stop_process(proc)
    time.sleep(0.1)
    detail = errors[-1].strip() if errors else "no startup line"
    raise RuntimeError(f"the exporter did not start: {detail}")


def _drain(lines: queue.Queue) -> None:
    while lines.get() is not None:
        pass


def path_hint() -> str | None:
    """How to run the README's next commands when ``verl-monitor`` is not on PATH (``make
    demo`` installs it in .venv/bin): None when it is."""
    import os

    if shutil.which("verl-monitor"):
        return None
    here = os.path.join(os.path.dirname(sys.executable), "verl-monitor")
    if not os.path.exists(here):
        return None
    venv = os.path.dirname(os.path.dirname(sys.executable))
    return (f"the other commands are in {os.path.dirname(here)}: run `source "
            f"{os.path.relpath(os.path.join(venv, 'bin', 'activate'))}` to have verl-monitor on "
            f"PATH (e.g. verl-monitor demo --speed 10)")


def scenario_mode(name: str) -> str:
    """The trainer mode a scenario or script plays (``sync``, ``agent_loop``,
    ``fully_async``); raises ``UnknownScenario`` (one line, the valid names) when it cannot
    be played."""
    from monitor.sim.scenarios import resolve_script, script_mode

    return script_mode(resolve_script(name, None, 0.4))


#: How ``verl-monitor demo`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": ("simulated verl run + exporter + dashboard: every page live in about ten minutes "
        "(a minute with --speed 10)"),
    "description": ("Play a simulated verl run (healthy, then IO starvation, a reshard spike, "
        "a straggling GPU, a rollout long tail, over about ten minutes), monitor it with the "
        "exporter (sim GPU backend), and serve the dashboard on its run store. Ctrl-C stops."),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``verl-monitor demo``."""
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"dashboard port (default {DEFAULT_PORT})")
    parser.add_argument("--address", default=DEFAULT_ADDRESS,
                        help=f"dashboard and exporter bind address (default {DEFAULT_ADDRESS})")
    parser.add_argument("--exporter-port", type=int, default=0,
                        help="exporter /metrics port (default 0: any free port, printed)")
    parser.add_argument("--prometheus", metavar="URL",
                        help="read the dashboard from this Prometheus (point it at the "
                        "printed /metrics URL) instead of the local run store")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="simulated seconds per wall second (default 1: ten minutes; "
                        "10 plays the whole scenario in about a minute)")
    parser.add_argument("--dir", metavar="DIR",
                        help="where the log and the run store go (default: a new temp dir, "
                        "removed when the demo stops)")
    parser.add_argument("--scenario", default="demo",
                        help="scenario or script to simulate (default demo): agent_loop_demo "
                        "(server-mode rollout: a full KV cache, a generation tail, agent-loop "
                        "overhead) and fully_async_demo (a slow rollout pool, a long weight "
                        "sync, stale samples, an idle rollouter) and separate_async_demo (V1: "
                        "a slow standalone rollout, evictions) serve simulated vLLM servers "
                        "too; `verl-monitor simulate --list` lists every one")
    parser.add_argument("--node", default="demo-node", help="node name (default demo-node)")


@exits("demo")
def run(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C (0), a child failing (1) or bad input (2)."""
    from monitor.extras import explain_missing

    fail_if(explain_missing("dashboard", "the demo"))
    fail_if(args.speed <= 0 and "--speed must be > 0")
    from monitor.sim.scenarios import UnknownScenario

    try:
        mode = scenario_mode(args.scenario)
    except UnknownScenario as exc:
        raise CommandError(str(exc)) from exc
    fail_if(port_check(args.address, args.port, "dashboard "))
    try:
        workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="verl-monitor-"))
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"cannot use --dir {args.dir}: {exc.strerror}") from exc
    for stale in ("train.log", "run.db", "run.db-wal", "run.db-shm"):
        (workdir / stale).unlink(missing_ok=True)
    shutil.rmtree(workdir / "nccl", ignore_errors=True)  # a previous demo's dumps
    exporter = dashboard = None
    previous = signal.signal(signal.SIGTERM, interrupt_on_signal)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})  # inherited masks
    try:
        listen = f"{args.address}:{args.exporter_port}"
        try:
            exporter, metrics_url = start_exporter(
                exporter_command(workdir, args.scenario, args.speed, listen, args.node),
                env=exporter_env(workdir))
        except RuntimeError as exc:
            raise CommandError(str(exc), FAILED) from exc
        dashboard = start_dashboard(args.port, args.address, store=str(workdir / "run.db"),
                                    prometheus=args.prometheus)
        url = display_url(args.address, args.port)
        if not wait_healthy(url if args.address not in ("0.0.0.0", "::") else
                            f"http://127.0.0.1:{args.port}", dashboard):
            why = port_problem(args.address, args.port) or (
                f"Streamlit exited with status {dashboard.poll()}"
                if dashboard.poll() is not None else "no answer within 60 s")
            raise CommandError(f"the dashboard did not start on {url}: {why}", FAILED)
        source = redact(args.prometheus) if args.prometheus else workdir / "run.db"
        print(f"verl-monitor demo: dashboard {url}\n"
              f"verl-monitor demo: exporter metrics {metrics_url}\n"
              f"verl-monitor demo: simulated run '{args.scenario}' ({mode} trainer) at "
              f"{args.speed:g}x; "
              f"log {workdir / 'train.log'}, dashboard source {source}\n"
              "verl-monitor demo: Ctrl-C stops everything", flush=True)
        hint = path_hint()
        if hint:
            print(f"verl-monitor demo: {hint}", flush=True)
        while True:
            for name, proc in (("exporter", exporter), ("dashboard", dashboard)):
                if proc.poll() is not None:
                    raise CommandError(f"the {name} stopped (exit {proc.returncode})", FAILED)
            time.sleep(0.5)
    except KeyboardInterrupt:
        warn("demo", "stopping")
        return 0
    finally:
        stop_process(dashboard)
        stop_process(exporter)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        if not args.dir:  # our own temp dir: nothing of it is the user's
            shutil.rmtree(workdir, ignore_errors=True)
