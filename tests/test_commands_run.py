"""``verl-monitor run -- CMD``: a real exporter child, a real job child, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ports import free_port

from cli.commands.run import (
    RunError,
    exit_status,
    file_sd_targets,
    nccl_environment,
    parse_nodes,
)

#: The exporter child without GPUs (none on a CI machine) and with a fast detector loop.
EXPORTER_ARGS = "--exporter-args=--no-collector.gpu --interval 0.2"


def run_cli(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "monitor", "run", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


VERL_LINE = ("(TaskRunner pid=11) step:{step} - timing_s/gen:10.0 - timing_s/update_actor:5.0 - "
             "timing_s/step:20.0 - perf/throughput:1234.5 - training/global_step:{step}")


@pytest.mark.slow
def test_output_passes_through_is_logged_followed_and_exit_code_returned(tmp_path):
    port = free_port()
    job = script(tmp_path, f"""
        import sys, time, urllib.request
        for step in (1, 2, 3):
            print({VERL_LINE!r}.format(step=step), flush=True)
        print("a warning on stderr", file=sys.stderr, flush=True)
        # the exporter on this node follows what we print: wait until it has read step 3
        for _ in range(300):
            try:
                text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode()
            except OSError:
                text = ""
            if "verlmon_training_step 3" in text:
                print("exporter saw step 3", flush=True)
                break
            time.sleep(0.1)
        sys.exit(7)
    """)
    log = tmp_path / "logs" / "train.log"
    proc = run_cli(["--log", str(log), "--listen-address", f"127.0.0.1:{port}", EXPORTER_ARGS,
                    "--linger", "0", "--", sys.executable, job], tmp_path)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 7, err.decode()
    assert "step:3" in out.decode() and "exporter saw step 3" in out.decode(), err.decode()
    assert "a warning on stderr" in out.decode()  # both streams are shown, read from the log
    text = log.read_text()
    assert "step:1 " in text and "step:3 " in text and "a warning on stderr" in text
    assert "exporter saw step 3" in text
    assert not port_open(port), "the exporter still runs after the command exited"


@pytest.mark.slow
def test_ctrl_c_reaches_the_job_while_the_exporter_still_runs(tmp_path):
    port = free_port()
    job = script(tmp_path, f"""
        import signal, sys, time, urllib.request
        def on_int(signum, frame):
            # the exporter must still be up when the job gets the interrupt
            up = urllib.request.urlopen("http://127.0.0.1:{port}/metrics").status == 200
            print(f"job got SIGINT, exporter up={{up}}", flush=True)
            sys.exit(42)
        signal.signal(signal.SIGINT, on_int)
        print("job ready", flush=True)
        while True:
            time.sleep(0.1)
    """)
    proc = run_cli(["--log", str(tmp_path / "t.log"), "--listen-address", f"127.0.0.1:{port}",
                    EXPORTER_ARGS, "--linger", "0", "--", sys.executable, job], tmp_path)
    deadline = time.monotonic() + 60
    log = tmp_path / "t.log"
    while time.monotonic() < deadline and not (log.exists() and "job ready" in log.read_text()):
        time.sleep(0.1)
    try:
        assert port_open(port)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "job got SIGINT, exporter up=True" in out.decode(), err.decode()
    assert proc.returncode == 42
    assert not port_open(port)


@pytest.mark.slow
def test_a_killed_run_leaves_no_exporter_behind(tmp_path):
    port = free_port()
    log = tmp_path / "t.log"
    proc = run_cli(["--log", str(log), "--listen-address", f"127.0.0.1:{port}", EXPORTER_ARGS,
                    "--", sys.executable, "-c", "import os, time; "
                    f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid())); "
                    "time.sleep(120)"], tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not port_open(port):
            time.sleep(0.1)
        assert port_open(port)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
        if (tmp_path / "pid").exists():  # the job itself is not ours to kill in real use
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and port_open(port):
        time.sleep(0.2)
    assert not port_open(port), ("the exporter outlived a SIGKILLed verl-monitor run: "
                                 + listener_report(port, log))


def listener_report(port: int, log: Path) -> str:
    """Who still listens on ``port`` (pid, command, signal masks) and the exporter's output:
    enough to tell a missed SIGTERM from a slow stop when this fails on CI only."""
    import psutil

    lines = []
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            status = Path(f"/proc/{conn.pid}/status").read_text() if conn.pid else ""
            masks = [ln for ln in status.splitlines() if ln.startswith(("State", "Sig", "Shd"))]
            lines.append(f"pid {conn.pid}: {psutil.Process(conn.pid).cmdline()} {masks}"
                         if conn.pid else "a listener of another user")
    out = log.with_name(log.name + ".exporter.log")
    tail = out.read_text(errors="replace")[-2000:] if out.exists() else "(no exporter log)"
    return "; ".join(lines) + f"\nexporter output:\n{tail}"


@pytest.mark.slow
def test_job_killed_by_a_signal_reports_128_plus_n(tmp_path):
    proc = run_cli(["--no-exporter", "--log", str(tmp_path / "t.log"), "--",
                    sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                   tmp_path)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM


@pytest.mark.slow
def test_nccl_inspector_environment_reaches_the_job_and_the_exporter(tmp_path):
    plugin = tmp_path / "libnccl-profiler-inspector.so"
    plugin.write_bytes(b"\x7fELF")
    port = free_port()
    job = script(tmp_path, """
        import json, os
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("NCCL_")}))
    """)
    log = tmp_path / "t.log"
    proc = run_cli(["--log", str(log), "--listen-address", f"127.0.0.1:{port}", EXPORTER_ARGS,
                    "--linger", "0", "--nccl-plugin", str(plugin),
                    "--nccl-dump-interval-us", "1000000", "--", sys.executable, job], tmp_path)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err.decode()
    env = json.loads(out.decode().strip().splitlines()[-1])
    dump_dir = str(log.with_name("t.log.nccl"))
    assert env == {"NCCL_PROFILER_PLUGIN": str(plugin), "NCCL_INSPECTOR_ENABLE": "1",
                   "NCCL_INSPECTOR_DUMP_DIR": dump_dir,
                   "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": "1000000",
                   "NCCL_INSPECTOR_DUMP_VERBOSE": "1"}
    assert Path(dump_dir).is_dir()
    # the exporter was told to follow the same directory
    assert f"--nccl-dir', '{dump_dir}'" in str(_exporter_argv_for(log, plugin, dump_dir))


def _exporter_argv_for(log: Path, plugin: Path, dump_dir: str) -> list[str]:
    from cli.commands.run import exporter_argv, parse_options

    args = parse_options(["--nccl-plugin", str(plugin), "--", "true"])
    return exporter_argv(args, log, "n0", dump_dir)


@pytest.mark.slow
def test_no_nccl_variables_without_a_plugin(tmp_path):
    proc = run_cli(["--no-exporter", "--log", str(tmp_path / "t.log"), "--", sys.executable,
                    "-c", "import os; print(sorted(k for k in os.environ if 'INSPECTOR' in k))"],
                   tmp_path, env={k: v for k, v in os.environ.items() if "NCCL" not in k})
    out, _ = proc.communicate(timeout=60)
    assert out.decode().strip() == "[]"


@pytest.mark.slow
def test_targets_file_lists_every_node_while_the_job_runs_and_goes_with_it(tmp_path):
    targets = tmp_path / "sd" / "job.json"
    nodes = "gpu-001\ngpu-002\ngpu-003"  # as `scontrol show hostnames` prints them
    proc = run_cli(["--no-exporter", "--log", str(tmp_path / "t.log"), "--targets-file",
                    str(targets), "--nodes", nodes, "--job", "grpo", "--", "cat", str(targets)],
                   tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    groups = json.loads(out)  # what Prometheus read while the job ran
    assert [g["targets"] for g in groups] == [["gpu-001:9048"], ["gpu-002:9048"], ["gpu-003:9048"]]
    assert [g["labels"] for g in groups] == [{"node": f"gpu-00{i}", "job": "grpo"}
                                             for i in (1, 2, 3)]
    assert not targets.exists(), "a finished job's nodes would stay scraped (ExporterDown)"
    proc = run_cli(["--no-exporter", "--log", str(tmp_path / "t.log"), "--targets-file",
                    str(targets), "--keep-targets", "--", "true"], tmp_path)
    proc.communicate(timeout=60)
    assert len(json.loads(targets.read_text())) == 1


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    ([], "no command given"),
    (["--", "/nonexistent/verl-trainer"], "cannot start /nonexistent/verl-trainer"),
    (["--nccl-plugin", "/nonexistent.so", "--", "true"], "--nccl-plugin /nonexistent.so"),
    (["--exporter-args=--interval", "--", "true"], "the exporter exited with status 2"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, args, words):
    proc = run_cli(["--log", str(tmp_path / "t.log"), "--listen-address", "127.0.0.1:0", *args],
                   tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = [ln for ln in err.decode().splitlines() if ln.startswith("verl-monitor run:")]
    assert len(lines) == 1 and words in lines[0], err.decode()


def test_pure_helpers():
    assert parse_nodes("a, b\nc a") == ["a", "b", "c"]
    assert file_sd_targets(["h1", "h2:9100"], 9048) == [
        {"targets": ["h1:9048"], "labels": {"node": "h1"}},
        {"targets": ["h2:9100"], "labels": {"node": "h2"}}]
    with pytest.raises(RunError):
        file_sd_targets(["h1:x"], 9048)
    assert exit_status(-15) == 143 and exit_status(3) == 3
    assert nccl_environment("/p.so", "/d", 5)["NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS"] == "5"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["directory", "binary"])
def test_a_log_that_is_a_directory_or_binary_is_refused(tmp_path, kind):
    """The job's output is appended to --log: a directory or a binary file is refused in one
    line, exit 2, before anything starts (issue 24)."""
    log = tmp_path / "logs"
    if kind == "directory":
        log.mkdir()
    else:
        log.write_bytes(b"\x00\x01\x02" * 100)
    proc = run_cli(["--no-exporter", "--log", str(log), "--", sys.executable, "-c", "0"],
                   tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and f"--log {log}: is a {kind}" in lines[0], lines


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie counts: it runs no more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.slow
def test_a_job_outlives_a_kill_9_of_run_and_logs_every_line(tmp_path):
    """Issue 30 row 1: the job's output does not go through ``run``: a SIGKILLed (or
    OOM-killed) ``run`` leaves the job running, and every line it prints lands in the log."""
    log = tmp_path / "t.log"
    done = tmp_path / "done"
    job = script(tmp_path, f"""
        import os, sys, time
        open({str(tmp_path / 'pid')!r}, "w").write(str(os.getpid()))
        for i in range(200):
            print(f"line {{i}}", flush=True)
            if i == 20:
                # wait until the test has killed `run`, then keep printing
                while not os.path.exists({str(tmp_path / 'killed')!r}):
                    time.sleep(0.02)
        print("and on stderr", file=sys.stderr, flush=True)
        open({str(done)!r}, "w").write("ok")
    """)
    proc = run_cli(["--no-exporter", "--log", str(log), "--", sys.executable, job], tmp_path)
    try:
        assert _wait_for(lambda: log.exists() and "line 20\n" in log.read_text())
        proc.kill()
        proc.communicate(timeout=30)
        (tmp_path / "killed").write_text("")
        job_pid = int((tmp_path / "pid").read_text())
        _wait_for(lambda: done.exists() or _gone(job_pid))
        assert done.exists(), "the job died with verl-monitor run"
    finally:
        if proc.poll() is None:
            proc.kill()
        if (tmp_path / "pid").exists() and not done.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    lines = log.read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("line ")] == [f"line {i}" for i in range(200)]
    assert "and on stderr" in lines


@pytest.mark.slow
def test_a_grandchild_keeps_its_output_after_the_job_and_run_exit(tmp_path):
    """Issue 30 row 1: a grandchild that keeps stdout open after the job exits writes all its
    lines to the log, even after ``run`` is gone; ``run`` prints no traceback."""
    log = tmp_path / "t.log"
    done = tmp_path / "done"
    grandchild = script(tmp_path, f"""
        import os, sys, time
        run_pid = int(sys.argv[1])
        open({str(tmp_path / 'gpid')!r}, "w").write(str(os.getpid()))
        print("grandchild started", flush=True)
        for _ in range(1200):  # until `run` has exited
            try:
                state = open(f"/proc/{{run_pid}}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.05)
        for i in range(100):
            print(f"grandchild {{i}}", flush=True)
        open({str(done)!r}, "w").write("ok")
    """)
    job = [sys.executable, "-c", "import os, subprocess, sys; "
           f"subprocess.Popen([sys.executable, {grandchild!r}, str(os.getppid())]); "
           "print('child exits', flush=True)"]
    proc = run_cli(["--no-exporter", "--linger", "0", "--log", str(log), "--", *job], tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode(), err.decode()
    assert _wait_for(lambda: (tmp_path / "gpid").exists())
    gpid = int((tmp_path / "gpid").read_text())
    _wait_for(lambda: done.exists() or _gone(gpid))
    assert done.exists(), "the grandchild died (a broken pipe) after run exited"
    lines = log.read_text().splitlines()
    assert "child exits" in lines and "grandchild started" in lines
    assert [ln for ln in lines if ln.startswith("grandchild ") and ln[11:].isdigit()] == [
        f"grandchild {i}" for i in range(100)]


@pytest.mark.slow
def test_run_records_when_it_captured_each_line(tmp_path):
    """Issue 28 item 2: ``run`` writes ``<log>.arrivals`` (offset and capture time of the
    lines), leaving the log itself exactly as printed."""
    from monitor.logs.arrivals import read_arrivals

    log = tmp_path / "t.log"
    log.write_text("an older run's line\n")
    job = script(tmp_path, f"""
        import os, time
        for i in range(3):
            print(f"step {{i}}", flush=True)
            n = os.path.getsize({str(log)!r})
            for _ in range(400):  # until `run` has recorded the line
                if os.path.exists({str(log) + '.arrivals'!r}) and str(n - len(f"step {{i}}") - 1) in \\
                        [r.split()[0] for r in open({str(log) + '.arrivals'!r}) if r.strip()]:
                    break
                time.sleep(0.01)
    """)
    started = time.time()
    proc = run_cli(["--no-exporter", "--linger", "0", "--log", str(log), "--", sys.executable,
                    job], tmp_path)
    out, err = proc.communicate(timeout=60)
    finished = time.time()
    assert proc.returncode == 0, err.decode()
    data = log.read_bytes()
    assert data == b"an older run's line\nstep 0\nstep 1\nstep 2\n"
    assert out.decode() == "step 0\nstep 1\nstep 2\n"  # shown on the terminal as printed
    arrivals = read_arrivals(log)
    assert arrivals is not None
    offsets = [o for o, _ in arrivals]
    assert offsets == [data.index(b"step 0"), data.index(b"step 1"), data.index(b"step 2")]
    times = [t for _, t in arrivals]
    assert started <= times[0] <= times[1] <= times[2] <= finished


@pytest.mark.slow
def test_each_start_and_exit_is_one_attempt_in_the_logs_attempts_file(tmp_path):
    from monitor.logs.attempt_marks import read_marks

    log = tmp_path / "t.log"
    for code in (3, 0):
        proc = run_cli(["--no-exporter", "--log", str(log), "--", sys.executable, "-c",
                        f"import os; print(os.getpid()); raise SystemExit({code})"], tmp_path)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == code
    marks = read_marks(log)
    assert [(m.kind, m.data.get("status")) for m in marks] == [
        ("attempt_start", None), ("attempt_end", 3), ("attempt_start", None), ("attempt_end", 0)]
    pids = [int(x) for x in log.read_text().split()]
    assert [m.data["pid"] for m in marks if m.kind == "attempt_start"] == pids
    assert marks[2].data["offset"] == len(log.read_text().splitlines()[0]) + 1  # 2nd output


def test_on_hang_reaches_the_exporter():
    from cli.commands.run import exporter_argv, parse_options

    argv = exporter_argv(parse_options(["--on-hang", "terminate", "--", "true"]),
                         Path("/tmp/t.log"), "n0", None)
    assert argv[argv.index("--on-hang") + 1] == "terminate"
    plain = exporter_argv(parse_options(["--", "true"]), Path("/tmp/t.log"), "n0", None)
    assert "--on-hang" not in plain
