"""Collector registration: every collector module registers itself and gets its flags."""

from __future__ import annotations

from exporters.registry import (
    COLLECTOR_MODULES,
    REGISTRY,
    BaseCollector,
    ExporterContext,
    load_all,
    register,
)


def test_load_all_registers_every_collector_module():
    specs = load_all()
    assert set(COLLECTOR_MODULES) <= set(specs)
    for name in COLLECTOR_MODULES:
        spec = specs[name]
        assert spec.name == name and spec.help, name
        assert issubclass(spec.factory, BaseCollector) and spec.factory.name == name


def test_register_names_the_class_and_a_base_collector_is_healthy_and_empty():
    @register("test_only_collector", default=False, help="for this test")
    class Dummy(BaseCollector):
        pass

    try:
        assert Dummy.name == "test_only_collector"
        assert REGISTRY["test_only_collector"].default is False
        c = Dummy(ExporterContext(node="n0", interval=1.0))
        assert c.healthy() and list(c.collect()) == []
        c.last_error = "NVML call failed"
        assert not c.healthy()
    finally:
        REGISTRY.pop("test_only_collector", None)


def _help_sections(parser) -> dict[str, str]:
    """``--help`` cut at its group titles: title -> the text of that group."""
    import re

    text = parser.format_help()
    titles = [g.title for g in parser._action_groups]
    pattern = "|".join(re.escape(t) for t in titles)
    parts = re.split(rf"^({pattern}):$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _exporter_parser():
    import argparse

    from cli.commands.exporter import add_arguments

    parser = argparse.ArgumentParser(prog="verl-monitor exporter")
    add_arguments(parser)
    return parser


def test_each_collector_declares_its_flags_and_help_shows_them_in_its_own_group():
    """Issue 27: a collector's flags are declared beside it and listed under its name in
    ``verl-monitor exporter --help``, not among the command's own."""
    parser = _exporter_parser()
    sections = _help_sections(parser)
    with_flags = {name for name, spec in load_all().items() if spec.flags is not None}
    assert {*COLLECTOR_MODULES, "flight_recorder", "phase_gpu"} <= with_flags
    expected = {"gpu": "--gpu-backend", "host": "--train-pid", "verl_log": "--log-timezone",
                "nccl": "--nccl-window", "rollout_engine": "--rollout-timeout",
                "flight_recorder": "--hang-pyspy", "phase_gpu": "--phase-source"}
    for name in with_flags:
        group = next(g for g in parser._action_groups if g.title == f"{name} collector")
        declared = [s for a in group._group_actions for s in a.option_strings]
        assert declared, name
        for flag in declared:  # each with its help text, in its group and nowhere else
            assert flag in sections[f"{name} collector"], (name, flag)
            assert flag not in sections["options"], (name, flag)
        if name in expected:
            assert expected[name] in declared
    own = sections["options"]
    assert "--listen-address" in own and "--window" in own and "--web.config.file" in own
    assert "(default 30)" in " ".join(sections["nccl collector"].split())  # defaults still said


def test_a_flag_declared_by_a_collector_reaches_its_options_and_the_collector():
    """Every collector flag lands in a field of ExporterOptions (from_namespace keeps only
    fields: a flag without one would be dropped without a word), typed, and the collector
    built from those options uses it."""
    import dataclasses

    from cli.commands.exporter import parse_options
    from exporters.collectors.nccl import NcclCollector
    from exporters.options import ExporterOptions

    fields = {f.name for f in dataclasses.fields(ExporterOptions)}
    parser = _exporter_parser()
    for group in parser._action_groups:
        if group.title.endswith(" collector"):
            for action in group._group_actions:
                assert action.dest in fields, (group.title, action.option_strings)
    opts = parse_options(["--nccl-window", "12", "--train-pid", "42", "--fr-dir", "/fifo",
                          "--no-hang-pyspy", "--rollout-server", "h1:8000",
                          "--log-from-end", "--sim-gpus", "3"])
    assert (opts.nccl_window, opts.train_pid, opts.fr_dir, opts.hang_pyspy) == \
        (12.0, 42, "/fifo", False)
    assert opts.rollout_server == ("h1:8000",) and opts.log_from_end and opts.sim_gpus == 3
    assert opts.live_options().fr_dir == "/fifo"  # the view's flag reaches the monitor
    assert NcclCollector(ExporterContext(node="n0", interval=1.0, options=opts)).window_s == 12.0


def test_a_registered_collector_with_flags_gets_its_group_on_the_command_line():
    def add_flags(group) -> None:
        group.add_argument("--test-only-knob", type=int, default=7, help="a knob (default 7)")

    @register("test_only_flagged", default=False, help="for this test", flags=add_flags)
    class Flagged(BaseCollector):
        pass

    try:
        parser = _exporter_parser()
        assert "--test-only-knob" in _help_sections(parser)["test_only_flagged collector"]
        assert parser.parse_args(["--test-only-knob", "3"]).test_only_knob == 3
    finally:
        REGISTRY.pop("test_only_flagged", None)
