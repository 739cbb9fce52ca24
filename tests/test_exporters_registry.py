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
