"""The ``verl-monitor`` entry point: every subcommand listed, clear exits without one."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from monitor import __version__
from monitor.cli import COMMANDS, build_parser, main


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


def test_module_entry_point_reports_the_version():
    out = subprocess.run([sys.executable, "-m", "monitor", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"verl-monitor {__version__}"
