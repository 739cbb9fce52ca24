"""The ``exporter`` subcommand: its options, collector flags, and bad input as exit 2."""

from __future__ import annotations

import pytest

from cli.commands.exporter import DEFAULT_LISTEN, parse_options, run
from cli.main import build_parser
from exporters.node_exporter import Exporter, enabled_collectors
from exporters.registry import load_all


def test_defaults():
    opts = parse_options([])
    assert opts.listen_address == DEFAULT_LISTEN
    port = int(DEFAULT_LISTEN.rsplit(":", 1)[1])
    assert not 9100 <= port <= 9999
    assert opts.interval == 1.0 and opts.log == () and opts.store is None
    assert opts.gpu_backend is None  # chosen at start: nvml unless told otherwise


def test_a_flag_pair_for_every_collector(capsys):
    specs = load_all()
    opts = parse_options(["--no-collector.host", "--collector.nccl"])
    assert opts.collectors == {"host": False, "nccl": True}  # gpu untouched: its default
    names = enabled_collectors(opts, specs)
    assert "host" not in names and {"gpu", "nccl", "verl_log", "flags"} <= set(names)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["exporter", "--help"])
    help_text = capsys.readouterr().out
    for name in specs:
        assert f"--collector.{name}" in help_text and f"--no-collector.{name}" in help_text


def test_repeatable_logs_and_web_config_name():
    opts = parse_options(["--log", "a.log", "--log", "b.jsonl", "--web.config.file", "w.yml"])
    assert opts.log == ("a.log", "b.jsonl")
    assert opts.web_config_file == "w.yml"


def test_run_reports_bad_input_in_one_line(capsys, tmp_path):
    args = build_parser().parse_args([
        "exporter", "--interval", "0.01", "--listen-address", "127.0.0.1:0",
        "--gpu-backend", "sim"])
    assert run(args) == 2
    err = capsys.readouterr().err
    assert "--interval must be at least 0.1 seconds (got 0.01)" in err
    assert "Traceback" not in err


def test_options_build_an_exporter():
    exporter = Exporter(parse_options(["--interval", "0.5", "--node", "n7",
                                       "--listen-address", "127.0.0.1:0"]))
    assert exporter.node == "n7" and exporter.interval == 0.5
    assert exporter.monitor.detect_interval == 30.0  # detectors are costly: not every sample


def test_options_are_frozen_and_read_once_from_the_command_line():
    """The exporter's options are one typed, frozen value: the flags a user gave, nothing of
    argparse's namespace, and a collector flag only where one was given."""
    import dataclasses

    from exporters.options import ExporterOptions

    opts = parse_options(["--interval", "0.5", "--log", "a.log", "--dcgm-compat",
                          "--no-collector.goodput"])
    assert isinstance(opts, ExporterOptions)
    assert opts.interval == 0.5 and opts.log == ("a.log",) and opts.dcgm_compat
    assert opts.collector_enabled("goodput", True) is False
    assert opts.collector_enabled("gpu", True) is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.interval = 2.0  # type: ignore[misc]
    assert opts.with_log("b.log").log == ("a.log", "b.log") and opts.log == ("a.log",)


@pytest.mark.parametrize(("given", "said"), [
    (lambda d: ["--log", str(d)], "--log {d}: is a directory, not a log file"),
    (lambda d: ["--log", str(d / "bin.dat")], "is a binary file, not a verl log"),
    (lambda d: ["--scenario", "healthy", "--sim-log", str(d / "bin.dat" / "train.log")],
     "bin.dat is a file, so the log's folder cannot be made"),
    (lambda d: ["--scenario", "healthy", "--sim-log", str(d)], "is a directory"),
    (lambda d: ["--phase-source", "notaurl"], "expected the driver exporter's URL"),
])
def test_bad_paths_and_urls_are_refused_in_one_line_before_starting(capsys, tmp_path, given,
                                                                   said):
    """Issue 24: each used to start anyway (a directory logged an error every second, a binary
    log was followed silently) or end in a traceback."""
    (tmp_path / "bin.dat").write_bytes(b"\x7fELF\x02\x01\x01\x00" * 64)
    args = build_parser().parse_args([
        "exporter", "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", *given(tmp_path)])
    assert run(args) == 2
    err = capsys.readouterr().err
    assert said.format(d=tmp_path) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_log_that_does_not_exist_yet_is_accepted(tmp_path):
    from cli.commands.exporter import input_problem

    opts = parse_options(["--log", str(tmp_path / "later" / "train.log"),
                          "--gpu-backend", "sim", "--phase-source", "http://driver:9048/metrics"])
    assert input_problem(opts) is None


def _start_exporter(tmp_path, nofile: tuple[int, int], *extra: str, block: tuple = ()):
    """A real ``verl-monitor exporter`` under the given open-files limit, with the signals in
    ``block`` blocked as a parent could leave them; (process, port)."""
    import re
    import resource
    import shutil
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cli = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
    proc = subprocess.Popen(
        [cli, "exporter", "--listen-address", "127.0.0.1:0", "--no-collector.gpu",
         "--store", str(tmp_path / "run.db"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: (resource.setrlimit(resource.RLIMIT_NOFILE, nofile),
                            signal.pthread_sigmask(signal.SIG_BLOCK, block)))
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"no startup line: {line!r} {proc.stderr.read()}")
    return proc, int(found.group(1))


@pytest.mark.slow
def test_sighup_stops_cleanly_but_exits_non_zero_and_the_fd_limit_is_raised(tmp_path):
    """Before (issue 20): SIGHUP exited 0, so systemd's Restart=on-failure left the node
    unmonitored; and the exporter kept the soft limit of 1,024 open files."""
    import signal
    from pathlib import Path

    from cli.commands.exporter import HANGUP_EXIT

    proc, _ = _start_exporter(tmp_path, (1024, 4096))
    try:
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = next(ln for ln in limits.splitlines() if ln.startswith("Max open files")).split()
        assert soft[3] == "4096"  # raised to the hard limit at start
    finally:
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=30) == HANGUP_EXIT == 129
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.slow
def test_idle_sockets_past_the_open_files_limit_leave_scrapes_working(tmp_path):
    """Before (issue 20): 1,100 idle sockets against 1,024 open files made every real
    scrape time out (accept failed with EMFILE)."""
    import signal
    import socket
    import time

    import httpx

    proc, port = _start_exporter(tmp_path, (1024, 1024))
    idle = []
    try:
        for _ in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for _ in range(30):  # the kernel may queue some idle ones after the scrape: 30 s
            r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            assert r.status_code == 200 and "verlmon_build_info" in r.text
            closed = {ln.split('"')[1]: float(ln.split()[-1]) for ln in r.text.splitlines()
                      if ln.startswith("verlmon_http_connections_closed_total{")}
            # made room for newer ones, or (on a slow machine) timed out at the deadline
            if closed["evicted"] + closed["deadline"] >= 1100 - 256:
                break
            time.sleep(1.0)
        assert closed["evicted"] + closed["deadline"] >= 1100 - 256 and closed["evicted"] > 0
    finally:
        for s in idle:
            s.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_max_connections_option():
    assert parse_options([]).web_max_connections == 256
    assert parse_options(["--web.max-connections", "32"]).web_max_connections == 32
    with pytest.raises(SystemExit):
        parse_options(["--web.max-connections", "0"])


def test_help_says_what_sighup_does(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["exporter", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "SIGHUP stops it cleanly too but exits 129" in text and "no reload" in text
    assert "--web.max-connections" in text


def test_a_signal_at_any_moment_ends_the_wait():
    """The exporter's main thread waits on a wakeup socket, never on a lock its own signal
    handler also takes (issue 20's CI: a SIGTERM arriving as the wait began left an exporter
    running after its ``verl-monitor run`` was killed)."""
    import os
    import signal
    import socket
    import threading

    from cli.commands.exporter import wait_for_signal

    received: list[int] = []
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    previous_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    previous = signal.signal(signal.SIGUSR1, lambda signum, _f: received.append(signum))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # before the wait starts
        wait_for_signal(received, wake_r)
        assert received == [signal.SIGUSR1]
        received.clear()
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))  # during it
        timer.start()
        wait_for_signal(received, wake_r)
        timer.join()
        assert received == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.set_wakeup_fd(previous_wakeup)
        wake_r.close()
        wake_w.close()


@pytest.mark.slow
@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "parent-blocked-sigterm"])
def test_sigterm_as_the_exporter_starts_serving_stops_it(tmp_path, blocked):
    """SIGTERM sent the instant the startup line appears, when the main thread enters its
    wait, stops the exporter cleanly every time, even when its parent left SIGTERM blocked
    (a mask survives fork and exec: the exporter used to ignore such a SIGTERM for ever)."""
    import signal

    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        proc, _ = _start_exporter(tmp_path / str(attempt), (1024, 4096),
                                  block=(signal.SIGTERM,) if blocked else ())
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_help_groups_the_simulation_options_apart_from_the_real_ones():
    """Issue 38 item 6: --scenario, --sim-* and --seed sat among the real GPU options."""
    import argparse

    from cli.commands.exporter import SIM_FLAGS, SIM_GROUP_TITLE, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    groups = {g.title: {o for a in g._group_actions for o in a.option_strings}
              for g in parser._action_groups}
    assert groups[SIM_GROUP_TITLE] == SIM_FLAGS
    assert "--gpu-backend" in groups["gpu collector"]
    assert not SIM_FLAGS & groups["gpu collector"]
