"""``verl-monitor dashboard``: bad input is one line and exit 2; a real start and a clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from ports import free_port

from monitor.store.runstore import RunStore

pytestmark = pytest.mark.slow  # starts processes (make test-fast skips it)

CLI = [sys.executable, "-m", "monitor"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "dashboard", *args], capture_output=True, text=True, timeout=60)


def test_missing_store_is_one_line_and_exit_2(tmp_path):
    res = _cli("--store", str(tmp_path / "nope.db"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "no such run store" in res.stderr
    assert "Traceback" not in res.stderr


def test_file_that_is_not_a_store_is_refused(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, not a database\n" * 200)
    res = _cli("--store", str(bad))
    assert res.returncode == 2 and "not a verl-monitor run store" in res.stderr
    assert bad.read_text().startswith("hello")  # nothing lost


@pytest.mark.parametrize("args, named", [
    (["--prometheus", "notaurl"], "--prometheus 'notaurl': not an http(s) URL"),
    (["--prometheus", "localhost:9090"], "--prometheus 'localhost:9090': not an http(s) URL"),
    (["--prometheus", "http://h:9090", "--prometheus-timeout", "0"], "--prometheus-timeout 0"),
])
def test_a_bad_prometheus_option_is_one_line_and_exit_2(args, named):
    """Before: `--prometheus notaurl` started the app, whose every page then failed."""
    res = _cli(*args)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and named in res.stderr
    assert "Traceback" not in res.stderr


def test_source_is_required():
    res = _cli()
    assert res.returncode == 2 and "--store" in res.stderr


def _serve(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([*CLI, "dashboard", *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    return proc, line


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_serves_the_app_and_stops_cleanly(tmp_path, stop):
    store = tmp_path / "run.db"
    RunStore(store).close()
    proc, line = _serve(["--store", str(store)])
    try:
        assert "serving http://127.0.0.1:" in line and str(store) in line
        url = line.split("serving ", 1)[1].split()[0]
        assert urllib.request.urlopen(url + "/_stcore/health", timeout=5).read() == b"ok"
        proc.send_signal(stop)
        assert proc.wait(20) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_wait_starts_before_the_store_exists(tmp_path):
    proc, line = _serve(["--store", str(tmp_path / "later.db"), "--wait"])
    try:
        assert "serving http://127.0.0.1:" in line
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def test_busy_port_is_named_before_serving_and_exits_non_zero(tmp_path):
    store = tmp_path / "run.db"
    RunStore(store).close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        res = _cli("--store", str(store), "--port", str(port))
    assert res.returncode != 0
    assert "serving" not in res.stdout
    assert f"port {port}" in res.stderr and "already in use" in res.stderr
    assert res.stderr.count("\n") == 1
