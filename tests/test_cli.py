"""The ``verl-monitor`` entry point: every subcommand listed, clear exits without one."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from ports import free_port

from cli.main import COMMANDS, build_parser, main
from monitor import __version__


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_no_subcommand_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: verl-monitor" in capsys.readouterr().out


def test_unknown_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("name", COMMANDS)
def test_every_subcommand_has_help_and_a_handler(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert f"usage: verl-monitor {name}" in capsys.readouterr().out
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert callable(sub.choices[name].get_default("func"))


@pytest.mark.slow
def test_module_entry_point_reports_the_version():
    out = subprocess.run([sys.executable, "-m", "monitor", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"verl-monitor {__version__}"


def test_unknown_option_of_a_subcommand_prints_that_subcommands_usage(capsys):
    for argv in (["analyze", "--bogus"], ["analyze", "train.log", "--bogus"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: verl-monitor analyze"), err
        assert "verl-monitor analyze: error:" in err
    assert "unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("name", COMMANDS)
def test_a_mistyped_option_is_a_usage_error_on_every_command(name, capsys):
    """Issue 38 item 6: ``verl-monitor run --lgo t.log -- echo hi`` ended in a TypeError
    traceback (run's positional ``command`` took the place of the subcommand's name)."""
    with pytest.raises(SystemExit) as exc:
        main([name, "--lgo", "t.log", "--", "echo", "hi"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"usage: verl-monitor {name}") and "Traceback" not in err, err
    assert f"verl-monitor {name}: error:" in err


@pytest.mark.slow
def test_exporter_with_a_log_in_a_missing_folder_warns_once_and_exports_failure(tmp_path):
    import re
    import time
    import urllib.request

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "exporter", "--gpu-backend", "sim", "--scenario",
         "healthy", "--sim-gpus", "1", "--interval", "0.2", "--listen-address",
         f"127.0.0.1:{port}", "--log", "/nonexistent/dir/train.log",
         "--no-collector.host", "--no-collector.nccl"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        body, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=2).read().decode()
                if 'collector="verl_log"' in body:
                    time.sleep(1.0)  # several sampling rounds: still one warning
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                  timeout=2).read().decode()
                    break
            except OSError:
                pass
            time.sleep(0.3)
        assert re.search(r'verlmon_collector_success\{collector="verl_log"\} 0', body), body[:500]
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    warnings = [ln for ln in err.splitlines() if "/nonexistent/dir" in ln]
    assert len(warnings) == 1, err
    assert "does not exist" in warnings[0]
