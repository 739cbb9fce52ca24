"""``verl-monitor demo``: simulated run + exporter + dashboard, printed URLs, clean Ctrl-C."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from ports import free_port

pytestmark = pytest.mark.slow  # starts processes (make test-fast skips it)

CLI = [sys.executable, "-m", "monitor"]


def test_demo_serves_dashboard_and_metrics_then_stops_on_ctrl_c(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*CLI, "demo", "--speed", "20", "--port", str(port), "--dir",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].strip() == f"verl-monitor demo: dashboard http://127.0.0.1:{port}"
        metrics_url = lines[1].split("exporter metrics ", 1)[1].strip()
        assert "Ctrl-C" in lines[3]
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5)
        assert health.read() == b"ok"
        body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        assert "verlmon_gpu_utilization_ratio" in body
        # the simulated job dumps NCCL Inspector records: the Communication page has data
        import time

        deadline = time.monotonic() + 60
        while 'coll="AllReduce"' not in body and time.monotonic() < deadline:
            time.sleep(1.0)
            body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        assert 'coll="AllReduce"' in body
        assert any((tmp_path / "nccl").glob("*-pid*.log"))
        assert (tmp_path / "train.log").exists() and (tmp_path / "run.db").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        for url in (f"http://127.0.0.1:{port}/_stcore/health", metrics_url):
            try:
                urllib.request.urlopen(url, timeout=2)
            except OSError:
                continue
            raise AssertionError(f"{url} still answers after Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_bad_speed_and_bad_dir_are_exit_2(tmp_path):
    res = subprocess.run([*CLI, "demo", "--speed", "0"], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 2 and "--speed" in res.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = subprocess.run([*CLI, "demo", "--dir", str(blocker / "sub")], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2 and "cannot use --dir" in res.stderr
    assert res.stderr.count("\n") == 1


def test_demo_with_prometheus_points_the_dashboard_there(tmp_path):
    port, prom_port = free_port(), free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    proc = subprocess.Popen([*CLI, "demo", "--speed", "20", "--port", str(port), "--dir",
                             str(tmp_path), "--prometheus", prom], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert f"dashboard source {prom}" in lines[2]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_busy_dashboard_port_is_named_and_exits_non_zero(tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        res = subprocess.run([*CLI, "demo", "--port", str(port), "--dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert f"port {port}" in res.stderr and "already in use" in res.stderr
    assert "dashboard http" not in res.stdout


def test_demo_removes_its_temp_dir_when_it_stops(tmp_path):
    import os

    env = dict(os.environ, TMPDIR=str(tmp_path))
    port = free_port()
    proc = subprocess.Popen([*CLI, "demo", "--speed", "20", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert "Ctrl-C" in lines[3], lines
        made = [p for p in tmp_path.iterdir() if p.name.startswith("verl-monitor-")]
        assert len(made) == 1 and (made[0] / "run.db").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert not made[0].exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_unknown_or_mixed_scenario_is_exit_2_before_anything_starts(tmp_path):
    res = subprocess.run([*CLI, "demo", "--scenario", "meltdown", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "unknown scenario 'meltdown'" in res.stderr
    assert "fully_async_demo" in res.stderr and res.stderr.count("\n") == 1
    res = subprocess.run([*CLI, "demo", "--scenario", "pool_imbalance:3,generation_tail:3",
                          "--dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "cannot mix trainer modes" in res.stderr
    assert not (tmp_path / "run.db").exists()


def test_a_fully_async_demo_serves_the_rollout_engines(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*CLI, "demo", "--scenario", "fully_async_demo", "--speed", "20",
                             "--port", str(port), "--dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert "simulated run 'fully_async_demo' (fully_async trainer)" in lines[2], lines
        metrics_url = lines[1].split("exporter metrics ", 1)[1].strip()
        import time

        deadline = time.monotonic() + 60
        body = ""
        while "verlmon_rollout_kv_cache_usage_ratio{" not in body and time.monotonic() < deadline:
            time.sleep(1.0)
            body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        # the exporter scrapes the four simulated vLLM servers of the rollout pool
        up = [line for line in body.splitlines()
              if line.startswith("verlmon_rollout_server_up{") and line.endswith(" 1.0")]
        assert len(up) == 4, body[-2000:]
        assert 'engine="vllm"' in body
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_the_demo_says_how_to_get_the_readmes_commands_on_path(monkeypatch):
    """Issue 38 item 6: after ``make demo`` the README's next command (``verl-monitor demo
    --speed 10``) was not on PATH and nothing said so."""
    import shutil

    from cli.commands.demo import path_hint

    monkeypatch.setattr(shutil, "which", lambda name: None)
    hint = path_hint()
    assert hint is not None and "bin/activate" in hint and "verl-monitor demo --speed 10" in hint
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/local/bin/verl-monitor")
    assert path_hint() is None
