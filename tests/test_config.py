"""Config: defaults documented and loadable, user YAML overrides a subset, bad input is one line."""

import re

import pytest

from monitor.config import DEFAULTS_PATH, ConfigError, load_config
from monitor.records import FLAG_KINDS


def test_defaults_cover_every_flag_kind():
    cfg = load_config()
    for kind in FLAG_KINDS:
        assert cfg.section(kind), f"no thresholds for {kind}"


def test_every_threshold_in_defaults_has_a_comment():
    for line in DEFAULTS_PATH.read_text().splitlines():
        if re.match(r"^\s+\w+:\s*\S", line) and not line.strip().startswith("#"):
            assert "#" in line, f"undocumented threshold: {line.strip()}"


def test_user_file_overrides_a_subset(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("gpu_imbalance:\n  ratio: 0.5\nrollout_wait:\n  max_seconds: 0.1\n")
    cfg = load_config(str(path))
    assert cfg["gpu_imbalance"]["ratio"] == 0.5
    assert cfg["rollout_wait"]["max_seconds"] == 0.1
    # untouched keys keep their defaults
    assert cfg["gpu_imbalance"]["gap"] == load_config()["gpu_imbalance"]["gap"]


def test_unknown_key_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("gpu_imbalance:\n  ratoi: 0.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    msg = str(err.value)
    assert "gpu_imbalance.ratoi" in msg and str(path) in msg and "\n" not in msg


def test_unknown_section_and_wrong_type(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("nosuch:\n  x: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'nosuch'"):
        load_config(str(path))
    path.write_text("rollout_wait:\n  max_seconds: fast\n")
    with pytest.raises(ConfigError, match="must be a number"):
        load_config(str(path))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "absent.yaml"))
    path = tmp_path / "broken.yaml"
    path.write_text("gpu_imbalance: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(path))
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(path))


def test_empty_user_file_means_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(str(path)) == load_config()


def test_typed_reads_convert_and_name_a_missing_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("io_starvation:\n  min_samples: 7\n  iowait_high: 30\n")
    cfg = load_config(str(path))
    section = cfg.section("io_starvation")
    assert section.get_int("min_samples") == 7
    assert section.get_float("iowait_high") == 30.0
    assert isinstance(section.get_float("iowait_high"), float)
    assert cfg.get_float("io_starvation.iowait_high") == 30.0
    assert cfg.get_int("io_starvation.min_samples") == 7
    assert cfg.get_float("windows.no_such_key", 12.5) == 12.5
    with pytest.raises(KeyError, match="no_such_key"):
        section.get_float("no_such_key")
    with pytest.raises(KeyError):
        cfg.get_float("no_dot")
    assert cfg.section("no_such_section") == {}


# ---------------------------------------------------------------- issue 30 row 8: shapes,
# ranges and size checked, each with one line naming the key

@pytest.mark.parametrize("text, key, words", [
    ("suppress:\n  low_utilization: 5\n", "suppress.low_utilization", "list of flag kinds"),
    ("suppress:\n  low_utilization: [stalled, 7]\n", "suppress.low_utilization",
     "list of flag kinds"),
    ("suppress:\n  low_utilization: [stalld]\n", "suppress.low_utilization", "'stalld'"),
    ("suppress:\n  no_such_flag: [stalled]\n", "suppress.no_such_flag", "not a flag kind"),
    ("stalled:\n  min_seconds: -180\n", "stalled.min_seconds", "at least 0"),
    ("stalled:\n  median_multiple: -3\n", "stalled.median_multiple", "at least 0"),
    ("stalled:\n  idle_seconds: .nan\n", "stalled.idle_seconds", "finite"),
    ("stalled:\n  idle_seconds: .inf\n", "stalled.idle_seconds", "finite"),
    ("hang:\n  waiting_share: 1.5\n", "hang.waiting_share", "between 0 and 1"),
    ("memory_creep:\n  quantile: -0.1\n", "memory_creep.quantile", "between 0 and 1"),
    ("hang:\n  min_samples: 2.5\n", "hang.min_samples", "whole number"),
])
def test_shapes_and_ranges_are_checked_with_the_key_named(tmp_path, text, key, words):
    """Before: `suppress: {low_utilization: 5}` loaded, then `analyze` died and the exporter's
    detector loop failed on every pass; `stalled.min_seconds: -180` loaded and gave 61 false
    flags, one Slack post per step."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    message = str(err.value)
    assert key in message and words in message and "\n" not in message, message


def test_in_range_values_still_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("suppress:\n  low_utilization: [stalled, hang]\nstalled:\n  min_seconds: 0\n"
                    "hang:\n  waiting_share: 1\n  min_samples: 7.0\n")
    cfg = load_config(str(path))
    assert cfg["suppress"]["low_utilization"] == ["stalled", "hang"]
    assert cfg.get_float("stalled.min_seconds") == 0 and cfg.get_int("hang.min_samples") == 7


def test_a_huge_config_is_refused_before_it_is_parsed(tmp_path):
    """Before: a 100 MB --config ran 5 minutes and grew to 7.9 GB."""
    path = tmp_path / "big.yaml"
    with path.open("w") as fh:
        fh.write("stalled:\n  min_seconds: 180\n")
        fh.write("# " + "x" * 100 + "\n" * 1 + ("# padding\n" * 120_000))
    with pytest.raises(ConfigError, match=r"big.yaml: larger than 1 MB"):
        load_config(str(path))
