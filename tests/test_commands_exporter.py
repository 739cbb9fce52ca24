"""The ``exporter`` subcommand: its options, collector flags, and bad input as exit 2."""

from __future__ import annotations

import pytest

from exporters.app import Exporter, enabled_collectors
from exporters.registry import load_all
from monitor.cli import build_parser
from monitor.commands.exporter import DEFAULT_LISTEN, parse_options, run


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
