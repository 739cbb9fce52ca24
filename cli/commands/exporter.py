"""``verl-monitor exporter``: the node exporter (Prometheus /metrics, run store, live flags).

One process per node. It samples GPUs (NVML, or simulated), the host, the verl log(s) and NCCL
Inspector dumps in background threads, runs the detectors on a rolling window, writes a local
run store, and serves everything at ``/metrics``. Stops cleanly on SIGINT and SIGTERM (exit 0)
and on SIGHUP (exit 129, 128 + SIGHUP, so that ``Restart=on-failure`` restarts it: a hangup is
not a requested stop); each flushes and closes the store first. Its soft open-files limit is
raised to the hard limit (at most 65,536) at start, as Go exporters do.

Its parser holds the command's own flags (the server, the live monitor) and, in a ``--help``
group per collector, the flags each collector declares beside it (``exporters.registry``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import signal
import socket
import sys
from typing import Any

from cli.errors import CommandError, exits, fail_if
from exporters.options import DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS, ExporterOptions
from exporters.registry import CollectorSpec
from monitor.printable import PrintableFormatter

#: Exit status after SIGHUP (128 + 1, as a shell reports it): a failure to systemd, so
#: ``Restart=on-failure`` restarts the exporter instead of leaving the node unmonitored.
HANGUP_EXIT = 128 + signal.SIGHUP


def _collector_specs() -> list[CollectorSpec]:
    """Every registered collector, sources first; a module that fails to import is still
    listed (its flags then are not: the exporter reports the failure when it starts)."""
    from exporters import registry

    out: list[CollectorSpec] = []
    for mod in registry.COLLECTOR_MODULES:
        try:
            importlib.import_module(f"exporters.collectors.{mod}")
        except Exception as exc:  # noqa: BLE001 - reported when the exporter starts
            out.append(registry.CollectorSpec(mod, registry.BaseCollector, True,
                                              f"(cannot be imported: {exc})"))
            continue
        if mod in registry.REGISTRY:
            out.append(registry.REGISTRY[mod])
    listed = {spec.name for spec in out}
    return out + [spec for name, spec in registry.REGISTRY.items() if name not in listed]


def _positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _add_server(p: argparse.ArgumentParser) -> None:
    """Where /metrics is served and how (TLS, auth, connections), the pace, node and store."""
    add = p.add_argument
    add("--listen-address", default=DEFAULT_LISTEN, metavar="HOST:PORT",
        help=f"address to serve /metrics on; port 0 picks a free one (default {DEFAULT_LISTEN}: "
        "outside the crowded 9100-9999 range)")
    add("--web.config.file", dest="web_config_file", metavar="FILE",
        help="web config (Prometheus exporter-toolkit format): tls_server_config {cert_file, "
        "key_file}, basic_auth_users {user: bcrypt hash}")
    add("--web.max-connections", dest="web_max_connections", type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS, metavar="N",
        help=f"HTTP connections served at once (default {DEFAULT_MAX_CONNECTIONS}; lowered to a "
        "third of the open-files limit); past it the connection that has waited longest for a "
        "request makes room, or the new one is closed")
    add("--interval", type=float, default=1.0, metavar="SECONDS",
        help="sampling interval of every collector, at least 0.1 (default 1)")
    add("--node", metavar="NAME",
        help="node name for verlmon_node_info and the store (default: the hostname)")
    add("--store", metavar="PATH",
        help="run store (SQLite) to record samples, steps, events and flags in; created when "
        "missing")


def _add_monitor(p: argparse.ArgumentParser) -> None:
    """The live monitor: thresholds, detector runs, window, the driver's phases, Slack, wandb."""
    add = p.add_argument
    add("--config", metavar="FILE", help="detector thresholds (YAML) overriding the defaults")
    add("--detect-interval", type=float, metavar="SECONDS",
        help="seconds between detector runs on the window (default 30, at least 1; a run costs "
        "a few hundred ms of CPU on a full window). A new step in the log also triggers a run, "
        "at most one a second")
    add("--window", type=float, default=1800.0, metavar="SECONDS",
        help="how much recent history the detectors see (default 1800)")
    add("--slack-webhook-file", metavar="FILE",
        help="file holding a Slack incoming-webhook URL: flags opened and resolved are posted "
        "there (with --store, messages not yet delivered survive a restart in the store's "
        "outbox)")
    add("--slack-digest-hours", metavar="HOURS", type=float, default=0.0,
        help="with --slack-webhook-file: every HOURS post where the GPU time went over that "
        "period (goodput and the top causes of loss; default 0: off)")
    add("--wandb", metavar="PROJECT[/RUN_ID]",
        help="also log the monitor's derived series (per-phase GPU activity, comm share, "
        "flags) to this wandb run, resumed by id or created in PROJECT, and raise run.alert "
        "for warning and critical flags; without network or API key it falls back to offline "
        "files and never blocks the exporter")


def _add_collectors(p: argparse.ArgumentParser, specs: list[CollectorSpec]) -> None:
    """``--collector.NAME`` / ``--no-collector.NAME`` for every registered collector."""
    group = p.add_argument_group("collectors", "turn each collector on or off")
    for spec in specs:
        state = "on" if spec.default else "off"
        group.add_argument(f"--collector.{spec.name}", dest=f"collector_{spec.name}",
                           action="store_true", default=None,
                           help=f"enable {spec.name}: {spec.help} (default {state})")
        group.add_argument(f"--no-collector.{spec.name}", dest=f"collector_{spec.name}",
                           action="store_false", default=None, help=f"disable {spec.name}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the exporter's options to ``parser`` (shared by the CLI, the tests and the bench):
    its own (the server, the live monitor), then each collector's, in a group titled by the
    collector (``gpu collector``), as the collector declares them (``flags=`` of
    ``exporters.registry.register``, ``monitor.live.ViewSpec``), then the on/off pairs."""
    _add_server(parser)
    _add_monitor(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log more (debug level)")
    specs = _collector_specs()
    sim = _LazyGroup(parser, SIM_GROUP_TITLE, SIM_GROUP_HELP)
    for spec in specs:
        if spec.flags is not None:
            spec.flags(_SimApart(parser.add_argument_group(collector_group_title(spec.name)),
                                 sim))
    _add_collectors(parser, specs)


#: The ``--help`` group of the simulator's flags, apart from those a real node uses.
SIM_GROUP_TITLE = "simulation (no GPU needed; for the demo, tests and trying the monitor out)"
SIM_GROUP_HELP = ("a simulated verl run instead of real GPUs and a real job: --gpu-backend sim "
                  "--scenario NAME, and --sim-log to write its log too")
#: Flags that belong to the simulator, whichever collector declares them.
SIM_FLAGS = frozenset({"--scenario", "--seed", "--sim-gpus", "--sim-log", "--sim-speed"})


class _LazyGroup:
    """An argument group made when its first flag comes (so ``--help`` lists it there)."""

    def __init__(self, parser: argparse.ArgumentParser, title: str, help_text: str) -> None:
        self._parser, self._title, self._help = parser, title, help_text
        self._group: Any = None

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        if self._group is None:
            self._group = self._parser.add_argument_group(self._title, self._help)
        return self._group.add_argument(*names, **kwargs)


class _SimApart:
    """A collector's flag group that sends the simulator's flags to the simulation group."""

    def __init__(self, group: Any, sim: _LazyGroup) -> None:
        self._group, self._sim = group, sim

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        target = self._sim if SIM_FLAGS.intersection(names) else self._group
        return target.add_argument(*names, **kwargs)


def collector_group_title(name: str) -> str:
    """The ``--help`` group that holds collector ``name``'s own flags."""
    return f"{name} collector"


def input_problem(options: ExporterOptions) -> str | None:
    """One line naming the first bad path or URL among the options, else None.

    A ``--log`` that does not exist yet is fine (it is followed once it appears); one that is a
    directory, a run store or a binary file is refused, as ``analyze`` refuses it. ``--sim-log``
    must be a file whose folder exists or can be made; ``--phase-source`` an http(s) URL.
    """
    import stat
    from pathlib import Path

    from cli.commands.analyze import log_file_problem

    for path in options.log:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # not there yet: followed once it appears
        if stat.S_ISFIFO(mode):
            continue  # a pipe is read as it is written; peeking at it would block the start
        if os.path.exists(path):
            problem = log_file_problem(path)
            if problem:
                return f"--log {problem}"
    if options.sim_log:
        sim = Path(options.sim_log)
        if sim.is_dir():
            return f"--sim-log {sim}: is a directory; give the log file's path (DIR/train.log)"
        folder = next((p for p in (sim.parent, *sim.parent.parents) if p.exists()), None)
        if folder is not None and not folder.is_dir():
            return f"--sim-log {sim}: {folder} is a file, so the log's folder cannot be made"
        if folder is not None and not os.access(folder, os.W_OK):
            return f"--sim-log {sim}: cannot write in {folder}"
    return url_options_problem(options)


def url_options_problem(options: ExporterOptions) -> str | None:
    """None when every URL option can be used, else one line naming it (never a password:
    ``user:pass@`` in a URL is sent as basic authentication, and shown nowhere)."""
    import urllib.parse

    from monitor.urls import UrlError, redact, split_url

    if options.phase_source:
        url = urllib.parse.urlsplit(redact(options.phase_source))
        if url.scheme not in ("http", "https") or not url.hostname:
            return (f"--phase-source {redact(options.phase_source)!r}: expected the driver "
                    "exporter's URL, e.g. http://DRIVER:9048/metrics")
    try:
        if options.phase_source:
            split_url(options.phase_source, "--phase-source")
        for target in options.rollout_server:
            split_url(target, "--rollout-server")
    except UrlError as exc:
        return str(exc)
    return None


#: How ``verl-monitor exporter`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "run the node exporter: Prometheus /metrics, run store, live flags",
    "description": ("Sample GPUs, host, verl logs and NCCL dumps on this node, run the "
        "detectors live, record a run store, and serve Prometheus metrics at /metrics."),
    "epilog": ("Signals: SIGTERM and SIGINT stop it cleanly (exit 0); SIGHUP stops it "
        "cleanly too but exits 129, so a supervisor (systemd Restart=, a restart loop) starts "
        "it again; there is no reload. Exit 2: bad options or web config."),
}


def parse_options(argv: list[str]) -> ExporterOptions:
    """Parse exporter arguments (no subcommand word) into the options ``Exporter`` takes."""
    parser = argparse.ArgumentParser(prog="verl-monitor exporter")
    add_arguments(parser)
    return ExporterOptions.from_namespace(parser.parse_args(argv))


def wait_for_signal(received: list[int], wake: socket.socket) -> None:
    """Block until ``received`` holds a signal. ``wake`` is the read end of the socket given
    to ``signal.set_wakeup_fd``: a signal arriving at any moment, even just before the
    select, leaves a byte there, so the wait cannot miss it."""
    while not received:
        select.select([wake], [], [], 60)
        try:
            while wake.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass


@exits("exporter")
def run(args: argparse.Namespace) -> int:
    """Start the exporter and serve until SIGINT/SIGTERM/SIGHUP; 0 on a clean stop, 129 after
    SIGHUP (stopped cleanly, but not asked to: a supervisor restarts it), 2 on bad input."""
    options = ExporterOptions.from_namespace(args)  # once: nothing after reads the namespace
    handler = logging.StreamHandler(sys.stderr)  # lines quoting logs and files, inert
    handler.setFormatter(PrintableFormatter("verl-monitor exporter: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if options.verbose else logging.INFO,
                        handlers=[handler])
    from exporters.metrics_server import raise_open_files_limit
    from exporters.node_exporter import Exporter, ExporterError
    from monitor.extras import explain_missing

    for given, flag, extra in ((options.wandb, "--wandb", "wandb"),
                               (options.slack_webhook_file, "--slack-webhook-file", "slack")):
        fail_if(given and explain_missing(extra, flag))
    fail_if(input_problem(options))
    received: list[int] = []

    def on_signal(signum, _frame) -> None:
        # only a list append here: a handler runs between any two bytecodes of the main
        # thread, so taking a lock (Event.set) could deadlock against the main thread's own
        # wait on it; the wakeup socket below ends the wait instead
        received.append(signum)

    # SIGHUP too (a closed terminal, a hung-up ssh session, `kill -HUP`): every one stops
    # cleanly, with the store's final flush and close; SIGHUP then exits 129, not 0
    raise_open_files_limit()
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    previous_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    stopping = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = {sig: signal.signal(sig, on_signal) for sig in stopping}
    # a mask inherited from whatever started us (a CI harness, a supervisor that blocks
    # signals around fork) would hold SIGTERM pending for ever: the exporter would outlive a
    # killed `verl-monitor run` and ignore systemd's stop
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
    exporter = None
    try:
        try:
            exporter = Exporter(options)
            exporter.start()
        except ExporterError as exc:
            raise CommandError(str(exc)) from exc
        print(exporter.startup_line(), flush=True)
        wait_for_signal(received, wake_r)
        return HANGUP_EXIT if signal.SIGHUP in received else 0
    finally:
        if exporter is not None:
            exporter.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_wakeup)
        wake_r.close()
        wake_w.close()
