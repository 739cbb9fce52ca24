"""``verl-monitor run [options] -- <the verl command>``: monitor one verl job on this node.

What it does, in order:

1. writes Prometheus file_sd targets for the job's nodes (``--targets-file``), when asked;
2. starts ``verl-monitor exporter`` as a child process (its own process group, so a Ctrl-C in
   the terminal does not stop it before the job), following the log this command writes;
   ``--no-exporter`` leaves that to an exporter the platform already runs on this node;
3. starts the command with the NCCL Inspector environment when ``--nccl-plugin`` is given,
   its stdout and stderr appended straight to the log (``--log``), which the exporter follows:
   the job never writes to a pipe this process reads, so a ``kill -9`` (or the OOM killer)
   of ``verl-monitor run`` costs the job nothing and every line still reaches the log. What
   the log gains is shown on our stdout (both streams, unchanged, progress bars included),
   and the time each line was captured goes to ``<log>.arrivals`` (``monitor.logs.arrivals``)
   so an offline ``analyze`` of the log has real times;
4. forwards SIGINT/SIGTERM/SIGHUP to the command first: the exporter keeps running while the
   job shuts down, so the job's last lines (a traceback, the final step) are still read;
5. when the command exits, stops the exporter (SIGTERM, then SIGKILL) and exits with the
   command's exit status (128 + N when a signal N ended it, as a shell reports it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from cli.children import stop_process
from cli.errors import CommandError, exits
from exporters.options import DEFAULT_LISTEN, DEFAULT_PORT
from monitor.hang.finish import clear_exit, mark_exit
from monitor.hang.procs import RUN_PID_ENV
from monitor.logs.arrivals import ArrivalWriter
from monitor.logs.attempt_marks import record_end, record_start
from monitor.safe_write import create_new_file, open_append

#: Seconds the exporter gets to stop after SIGTERM before it is killed.
EXPORTER_STOP_S = 15.0
#: Seconds to wait for the exporter's startup line before the job starts anyway.
EXPORTER_READY_S = 30.0
#: NCCL Inspector dump cadence when none is given: every 5 s (in microseconds).
DEFAULT_NCCL_DUMP_US = 5_000_000
#: Seconds between two reads of the log to show the job's new output on the terminal.
ECHO_POLL_S = 0.05
#: Seconds to wait for the terminal to take the job's last output before exiting anyway.
ECHO_STOP_S = 5.0

_SERVING = re.compile(r"serving (https?://\S+)/metrics")


class RunError(RuntimeError):
    """Bad input for ``verl-monitor run``; the message is one line saying what to change."""


#: How ``verl-monitor run`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "run a verl command with an exporter on this node, its output captured to a log",
    "description": ("Start the node exporter, run the verl command with its output passed "
        "through and captured to a log the exporter follows, and return the command's exit "
        "status. Example: verl-monitor run --log /tmp/verl.log -- python3 -m "
        "verl.trainer.main_ppo ..."),
    "usage": "verl-monitor run [options] -- COMMAND [ARG ...]",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``run`` options (shared with the tests)."""
    p.add_argument("--log", metavar="PATH",
                   help="file the command's output is appended to and the exporter follows "
                   "(default: verl-monitor-<node>-<time>.log in the current directory)")
    p.add_argument("--node", metavar="NAME",
                   help="this node's name for the exporter and the targets (default: hostname)")
    p.add_argument("--listen-address", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where the exporter serves /metrics (default {DEFAULT_LISTEN}; "
                   "port 0 picks a free one)")
    p.add_argument("--no-exporter", action="store_true",
                   help="only capture the log: an exporter started by the platform (srun, Ray, "
                   "a DaemonSet) on this node already follows --log")
    p.add_argument("--exporter-args", default="", metavar="'ARGS'",
                   help="more options for the exporter, one shell-quoted string (e.g. "
                   "\"--store run.db --interval 0.5\")")
    p.add_argument("--nccl-plugin", metavar="PATH",
                   help="NCCL Inspector plugin (libnccl-profiler-inspector.so): sets "
                   "NCCL_PROFILER_PLUGIN and the NCCL_INSPECTOR_* variables for the command "
                   "and points the exporter at the dump directory")
    p.add_argument("--nccl-dir", metavar="DIR",
                   help="NCCL Inspector dump directory (default: <log>.nccl next to the log)")
    p.add_argument("--nccl-dump-interval-us", type=int, default=DEFAULT_NCCL_DUMP_US,
                   metavar="US", help="NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS "
                   f"(default {DEFAULT_NCCL_DUMP_US})")
    p.add_argument("--targets-file", metavar="PATH",
                   help="write Prometheus file_sd targets (JSON) for the job's nodes here")
    p.add_argument("--nodes", metavar="LIST",
                   help="the job's nodes for --targets-file: comma- or space-separated host "
                   "names (HOST or HOST:PORT); default: this node only")
    p.add_argument("--keep-targets", action="store_true",
                   help="leave --targets-file in place when the command exits (by default it "
                   "is removed, so Prometheus stops scraping the job's nodes)")
    p.add_argument("--job", metavar="NAME",
                   help="`job` label written into the targets (default: Prometheus's scrape "
                   "job name is kept)")
    p.add_argument("--on-hang", choices=("alert", "dump", "terminate"), default=None,
                   help="what the exporter does on a confirmed hang: alert (the default: the "
                   "flag, Slack), dump (also saves the stacks, Flight Recorder dumps and the "
                   "log's last lines into the store) or terminate (also ends this command's "
                   "process tree once the hang has held --on-hang-after, default 10 min, so "
                   "the scheduler's retry resumes it from its last checkpoint; docs/attempts.md)")
    p.add_argument("--linger", type=float, default=2.0, metavar="SECONDS",
                   help="keep the exporter this long after the command exits, so it reads the "
                   "last lines and Prometheus scrapes the final state (default 2)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the command to run, after `--`")


def parse_options(argv: list[str]) -> argparse.Namespace:
    """Parse ``run`` arguments (without the subcommand word)."""
    parser = argparse.ArgumentParser(prog="verl-monitor run")
    add_arguments(parser)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------- pure helpers


def nccl_environment(plugin: str, dump_dir: str, interval_us: int) -> dict[str, str]:
    """The environment that turns NCCL Inspector on for a job and dumps into ``dump_dir``."""
    return {
        "NCCL_PROFILER_PLUGIN": plugin,
        "NCCL_INSPECTOR_ENABLE": "1",
        "NCCL_INSPECTOR_DUMP_DIR": dump_dir,
        "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": str(int(interval_us)),
        "NCCL_INSPECTOR_DUMP_VERBOSE": "1",
    }


def parse_nodes(text: str | None) -> list[str]:
    """Host names from a comma/space/newline-separated list (``scontrol show hostnames``
    output works as is); order kept, duplicates dropped."""
    out: list[str] = []
    for item in re.split(r"[\s,]+", text or ""):
        if item and item not in out:
            out.append(item)
    return out


def file_sd_targets(nodes: list[str], port: int, job: str | None = None) -> list[dict]:
    """Prometheus file_sd entries, one per node: ``HOST:PORT`` with a ``node`` label (a node
    given as ``HOST:PORT`` keeps its port; its ``node`` label is the host part)."""
    groups = []
    for item in nodes:
        host, _, own_port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise RunError(f"node {item!r} has no host name")
        if own_port and not own_port.isdigit():
            raise RunError(f"node {item!r}: the port after ':' must be a number")
        labels = {"node": host}
        if job:
            labels["job"] = job
        groups.append({"targets": [f"{host}:{own_port or port}"], "labels": labels})
    return groups


def write_targets(path: str | Path, groups: list[dict]) -> Path:
    """Write file_sd ``groups`` atomically (Prometheus never reads a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    create_new_file(tmp, json.dumps(groups, indent=2) + "\n")  # not through a planted link
    os.replace(tmp, path)
    return path


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + N for a child ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _listening(listen: str, url: str | None) -> str:
    """Where the exporter listens, in the words its own startup line uses (port 0: the port
    it picked, from its URL)."""
    from urllib.parse import urlsplit

    from exporters.metrics_server import parse_listen_address
    from exporters.node_exporter import listening_words

    try:
        host, port = parse_listen_address(listen)
    except ValueError:
        return f"listening on {listen}"
    if port == 0 and url:
        port = urlsplit(url).port or port
    return listening_words((host, port))


def _port_of(listen: str) -> int:
    _, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise RunError(f"--listen-address {listen!r}: expected HOST:PORT")
    return int(port)


# ---------------------------------------------------------------------------- the log echo


class LogEcho:
    """Shows the job's output on our terminal by reading it back from the log, and records
    when each line was captured (``<log>.arrivals``, see ``monitor.logs.arrivals``).

    The job writes to the log itself (its stdout and stderr are the file, opened for append),
    so nothing the job prints passes through this process: a ``kill -9`` of ``run`` leaves
    the job and its grandchildren writing every line to the log."""

    def __init__(self, log_path: Path, start: int, out: IO[bytes]) -> None:
        self.log_path = log_path
        self.start_offset = start  # where the job's output starts in the log
        self._fd = os.open(log_path, os.O_RDONLY)
        self._offset = start
        self._line_start = start  # where the line being completed started
        self._out: IO[bytes] | None = out
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self._arrivals: ArrivalWriter | None = ArrivalWriter(log_path)
        except OSError as exc:
            self._arrivals = None
            print(f"verl-monitor run: capture times not recorded ({exc.strerror or exc}); "
                  "the log is written as usual", file=sys.stderr)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="verl-monitor-run-echo")

    def start(self) -> None:
        """Follow the log on a background thread until ``stop``."""
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(ECHO_POLL_S):
            self.pump()

    def pump(self) -> None:
        """Show and time-stamp what the log gained since the last call (all of it)."""
        with self._lock:
            if self._fd < 0:
                return
            try:
                if os.fstat(self._fd).st_size < self._offset:  # truncated under us
                    self._offset = self._line_start = 0
                while True:
                    chunk = os.pread(self._fd, 1 << 20, self._offset)
                    if not chunk:
                        return
                    self._take(chunk, time.time())
            except OSError:
                return

    def _take(self, chunk: bytes, now: float) -> None:
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            if self._arrivals is not None:
                try:
                    self._arrivals.record(self._line_start, now, self._offset + cut + 1)
                except (OSError, ValueError):
                    self._arrivals = None  # the sidecar's disk failed: the log goes on
            self._line_start = self._offset + cut + 1
        self._offset += len(chunk)
        if self._out is not None:
            try:
                self._out.write(chunk)
                self._out.flush()
            except (OSError, ValueError):
                self._out = None  # our terminal went away: the log goes on

    def stop(self) -> None:
        """Show what is left, then stop following and close the log and the sidecar."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(ECHO_STOP_S)
            if self._thread.is_alive():
                return  # our stdout blocks (a reader that stopped reading): the log is whole
        self.pump()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._arrivals is not None:
                self._arrivals.close()


def open_job_log(log_path: Path) -> tuple[int, int]:
    """Open the log for the job's stdout and stderr (append); return the descriptor and the
    offset its output starts at. A log left without a final newline gets one first, so the
    job's first line is not glued to the last one of an earlier run."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and _byte_at(log_path, size - 1) != b"\n":
            os.write(fd, b"\n")
            size += 1
    except OSError:
        os.close(fd)
        raise
    return fd, size


def start_job(command: list[str], env: dict[str, str], out_fd: int) -> subprocess.Popen:
    """Start the job with ``out_fd`` (the log, for append) as its stdout and stderr, never a
    pipe to us: whatever happens to this process, the job (and its grandchildren) keep
    writing every line there. Its own process group: a Ctrl-C comes to us and we pass it on,
    so the job always gets it before the exporter is stopped. ``out_fd`` is closed here."""
    try:
        return subprocess.Popen(command, stdout=out_fd, stderr=out_fd, env=env,
                                process_group=0)
    except OSError as exc:
        raise RunError(f"cannot start {command[0]}: {exc.strerror or exc}") from None
    finally:
        os.close(out_fd)


def _open_log_and_echo(log_path: Path) -> tuple[int, LogEcho]:
    """The job's log descriptor and the echo that shows what it writes; RunError if not."""
    try:
        out_fd, start = open_job_log(log_path)
    except OSError as exc:
        raise RunError(f"--log {log_path}: cannot write ({exc.strerror or exc})") from None
    try:
        return out_fd, LogEcho(log_path, start, sys.stdout.buffer)
    except OSError as exc:
        os.close(out_fd)
        raise RunError(f"--log {log_path}: cannot read ({exc.strerror or exc})") from None


def _byte_at(path: Path, offset: int) -> bytes:
    with open(path, "rb") as fh:
        return os.pread(fh.fileno(), 1, offset)


# ---------------------------------------------------------------------------- the exporter


def exporter_argv(args: argparse.Namespace, log_path: Path, node: str,
                  nccl_dir: str | None) -> list[str]:
    """The command line of the exporter child this run starts."""
    argv = [sys.executable, "-m", "monitor", "exporter",
            "--listen-address", args.listen_address, "--node", node,
            "--log", str(log_path)]
    if nccl_dir:
        argv += ["--nccl-dir", nccl_dir]
    if getattr(args, "on_hang", None):
        argv += ["--on-hang", args.on_hang]
    try:
        argv += shlex.split(args.exporter_args or "")
    except ValueError as exc:
        raise RunError(f"--exporter-args: {exc}") from None
    return argv


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the exporter gets SIGTERM when this process dies, even by SIGKILL, so a killed
    ``verl-monitor run`` leaves no exporter behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_exporter(argv: list[str], log_path: Path) -> tuple[subprocess.Popen, str | None]:
    """Start the exporter in its own process group, its output in ``<log>.exporter.log``;
    return the process and its /metrics URL once it prints its startup line (None when it did
    not within EXPORTER_READY_S). Raises RunError when it exits at once (bad options). Its
    environment names this process (``RUN_PID_ENV``): the job this run starts beside it is
    the one whose processes it may read (monitor/hang/procs.py)."""
    out_path = log_path.with_name(log_path.name + ".exporter.log")
    try:  # never through a link planted at its name
        out = os.fdopen(open_append(out_path), "ab")
    except OSError as exc:
        raise RunError(f"{out_path}: cannot write ({exc.strerror or exc})") from None
    with out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                                env={**os.environ, "PYTHONUNBUFFERED": "1",
                                     RUN_PID_ENV: str(os.getpid())})
    deadline = time.monotonic() + EXPORTER_READY_S
    while time.monotonic() < deadline:
        text = out_path.read_text(errors="replace")
        found = _SERVING.search(text)
        if found:
            return proc, found.group(1) + "/metrics"
        if proc.poll() is not None:
            last = [ln for ln in text.strip().splitlines() if ln.strip()]
            raise RunError(f"the exporter exited with status {proc.returncode}: "
                           f"{last[-1] if last else 'no output'} (see {out_path})")
        time.sleep(0.1)
    return proc, None


# ---------------------------------------------------------------------------- the command


@exits("run")
def run(args: argparse.Namespace) -> int:
    """Run the command under the monitor; its exit status, or 2 on bad input."""
    try:
        return _run(args)
    except RunError as exc:
        raise CommandError(str(exc)) from exc


def _job_log_path(given: str | None, node: str) -> Path:
    """The log the job appends to (created, its folder too); RunError for a directory, a run
    store or a binary file, or a place that cannot be written."""
    log_path = Path(given or f"verl-monitor-{node}-{time.strftime('%Y%m%d-%H%M%S')}.log")
    if log_path.exists():  # appended to: a directory, a run store or a binary file is refused
        from cli.commands.analyze import log_file_problem

        problem = log_file_problem(str(log_path))
        if problem:
            raise RunError(f"--log {problem}")
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
    except OSError as exc:
        raise RunError(f"--log {log_path}: cannot write ({exc.strerror or exc})") from None
    return log_path.resolve()


def _run(args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise RunError("no command given: put it after `--`, e.g. verl-monitor run -- "
                       "python3 -m verl.trainer.main_ppo ...")
    if shutil.which(command[0]) is None:
        raise RunError(f"cannot start {command[0]}: no such program (not on PATH)")
    node = args.node or socket.gethostname()
    port = _port_of(args.listen_address)
    log_path = _job_log_path(args.log, node)
    env = {**os.environ, "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1")}
    nccl_dir = args.nccl_dir
    if args.nccl_plugin:
        if not Path(args.nccl_plugin).is_file():
            raise RunError(f"--nccl-plugin {args.nccl_plugin}: no such file")
        nccl_dir = nccl_dir or str(log_path.with_name(log_path.name + ".nccl"))
        Path(nccl_dir).mkdir(parents=True, exist_ok=True)
        env.update(nccl_environment(args.nccl_plugin, nccl_dir, args.nccl_dump_interval_us))

    nodes = parse_nodes(args.nodes) or [node]
    groups = file_sd_targets(nodes, port or DEFAULT_PORT, args.job)  # bad --nodes fails here
    targets_path: Path | None = None
    exporter: subprocess.Popen | None = None
    job: subprocess.Popen | None = None
    echo: LogEcho | None = None
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if job is not None and job.poll() is None:
            # a third Ctrl-C means "now": the job's process group gets SIGKILL
            sig = signal.SIGKILL if received.count(signal.SIGINT) >= 3 else signum
            try:
                os.killpg(job.pid, sig)
            except ProcessLookupError:
                pass

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, forward)
        # forwarded signals must arrive even when whatever started us blocked them
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(previous))
        if args.targets_file:
            targets_path = write_targets(args.targets_file, groups)
            print(f"verl-monitor run: {len(groups)} scrape target(s) written to {targets_path}",
                  file=sys.stderr)
        if not args.no_exporter:
            exporter, url = start_exporter(exporter_argv(args, log_path, node, nccl_dir),
                                           log_path)
            print(f"verl-monitor run: exporter {url or '(not ready yet)'} "
                  f"({_listening(args.listen_address, url)}), following {log_path}",
                  file=sys.stderr)
        if received:  # interrupted before the job started: do not start it
            return 128 + received[-1]
        clear_exit(log_path)  # the exporter reads <log>.exit as "the job exited"
        out_fd, echo = _open_log_and_echo(log_path)
        job = start_job(command, env, out_fd)
        record_start(log_path, job.pid, echo.start_offset)  # one attempt of the job: <log>.attempts
        echo.start()
        returncode = job.wait()
        echo.pump()
        status = exit_status(returncode)
        mark_exit(log_path, status)  # the exporter closes the run's flags: it finished
        record_end(log_path, status)
        print(f"verl-monitor run: command exited with status {status}; log {log_path}",
              file=sys.stderr)
        return status
    finally:
        if job is not None and job.poll() is None:
            stop_process(job, EXPORTER_STOP_S, EXPORTER_STOP_S)
        if exporter is not None:
            if exporter.poll() is None and job is not None and args.linger > 0:
                time.sleep(args.linger)
            stop_process(exporter, EXPORTER_STOP_S, EXPORTER_STOP_S)
        if echo is not None:
            echo.stop()  # what a grandchild printed meanwhile is shown too
        if targets_path is not None and not args.keep_targets:
            targets_path.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
