"""Version profiles: number formats, Ray prefixes, version lookup."""

from __future__ import annotations

import pytest

from monitor.sim.versions import VERSIONS, UnknownVersion, format_value, get_profile, ray_prefix


@pytest.mark.parametrize(
    "value,fmt,numpy_scalar,text",
    [
        (1, "fixed3", True, "1.000"),
        (1e-6, "fixed3", True, "0.000"),
        (float("nan"), "fixed3", True, "nan"),
        (float("inf"), "fixed3", True, "inf"),
        (34, "repr", True, "34"),
        (2e-06, "repr", True, "2e-06"),
        (3072.0, "repr", True, "3072.0"),
        (float("-inf"), "repr", True, "-inf"),
        (True, "repr", True, "True"),
        (0.5, "numpy", True, "np.float64(0.5)"),
        (-1, "numpy", True, "np.int64(-1)"),
        (0.5, "numpy", False, "0.5"),
        (34, "numpy", False, "34"),
        (True, "numpy", True, "np.True_"),
    ],
)
def test_format_value_matches_each_era(value, fmt, numpy_scalar, text):
    assert format_value(value, fmt, numpy_scalar) == text


def test_required_versions_are_modelled_and_aliases_resolve():
    for v in ("0.3", "0.4.1", "0.5", "0.6", "0.7.1", "0.8", "0.9"):
        assert v in VERSIONS
    assert get_profile("0.5.0").version == "0.5"
    assert get_profile("v0.7.1").version == "0.7.1"
    with pytest.raises(UnknownVersion, match="valid: 0.2, 0.3"):
        get_profile("0.10")


def test_reshard_key_style_follows_the_release():
    assert get_profile("0.4.0").reshard == "none"
    assert get_profile("0.4.1").reshard == get_profile("0.5").reshard == "nested"
    assert get_profile("0.6").reshard == get_profile("0.7.0").reshard == "derived"
    assert get_profile("0.7.1").reshard_after_update and get_profile("0.9").reshard_after_update


def test_ray_prefix_per_release():
    assert ray_prefix(get_profile("0.2"), 7, "1.2.3.4") == "(main_task pid=7) "
    assert ray_prefix(get_profile("0.5"), 7, "1.2.3.4") == "(TaskRunner pid=7) "
    assert ray_prefix(get_profile("0.9"), 7, "1.2.3.4") == (
        "\x1b[36m(TaskRunnerV1 pid=7, ip=1.2.3.4)\x1b[0m "
    )
