"""Detector configuration: every threshold lives in ``defaults.yaml``; a user YAML overrides.

``load_config(path)`` reads the defaults and overlays the user's file section by section.
A key that is not in the defaults, a value of the wrong type or shape (``suppress`` entries are
lists of flag kinds), a number that is not finite, negative, fractional where the default is a
whole number, or outside 0..1 for a share, fraction or quantile, and a file over
``MAX_CONFIG_BYTES``, are each a ``ConfigError`` with a one-line message naming the file and
the key.
"""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from typing import Any

import yaml

DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one clear line."""


_MISSING: Any = object()


class Section(dict):
    """One section of settings with typed reads: ``cfg.get_float("ratio")``.

    Each ``get_*`` converts the value to its type; ``default`` is used when the key is absent
    or its value is null, else a missing key raises ``KeyError`` naming it.
    """

    def _value(self, key: str, default: Any) -> Any:
        value = self.get(key)
        if value is None:
            if default is _MISSING:
                raise KeyError(key)
            return default
        return value

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        """The setting ``key`` as a float."""
        return float(self._value(key, default))

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        """The setting ``key`` as an int (a float setting is truncated, as ``int()`` does)."""
        return int(self._value(key, default))

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        """The setting ``key`` as a bool."""
        return bool(self._value(key, default))

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        """The setting ``key`` as a string."""
        return str(self._value(key, default))


class Config(dict):
    """Nested mapping of thresholds: ``config["gpu_imbalance"]["ratio"]``, or typed:
    ``config.get_float("gpu_imbalance.ratio")``, ``config.section("gpu_imbalance")``."""

    def section(self, name: str) -> Section:
        """The settings of one detector (or shared block), an empty section if absent."""
        return Section(self.get(name) or {})

    def _split(self, dotted: str) -> tuple[Section, str]:
        name, sep, key = dotted.partition(".")
        if not sep:
            raise KeyError(f"{dotted!r} is not section.key")
        return self.section(name), key

    def get_float(self, dotted: str, default: Any = _MISSING) -> float:
        """The setting ``"section.key"`` as a float (``default`` when absent or null)."""
        section, key = self._split(dotted)
        return section.get_float(key, default)

    def get_int(self, dotted: str, default: Any = _MISSING) -> int:
        """The setting ``"section.key"`` as an int (``default`` when absent or null)."""
        section, key = self._split(dotted)
        return section.get_int(key, default)

    def get_bool(self, dotted: str, default: Any = _MISSING) -> bool:
        """The setting ``"section.key"`` as a bool (``default`` when absent or null)."""
        section, key = self._split(dotted)
        return section.get_bool(key, default)


#: Largest ``--config`` read, bytes: the whole defaults file is ~25 KB. A bigger file is
#: refused before it is parsed (100 MB of YAML took 5 minutes and 7.9 GB).
MAX_CONFIG_BYTES = 1 << 20


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MB; a config holds "
                          "thresholds (the defaults are ~25 KB)")
    try:
        data = yaml.safe_load(raw.decode("utf-8", errors="replace"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unit_interval(dotted: str) -> bool:
    """Whether the key names a share, fraction or quantile (0..1; see the defaults' header)."""
    key = dotted.rsplit(".", 1)[-1]
    return "ratio" not in key and any(w in key for w in ("share", "fraction", "quantile"))


def _check_number(path: Path, dotted: str, default: Any, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path}: {dotted} must be a number, got {_short(value)}")
    if not math.isfinite(value):
        raise ConfigError(f"{path}: {dotted} must be a finite number, got {value!r}")
    if isinstance(default, int) and not float(value).is_integer():
        raise ConfigError(f"{path}: {dotted} must be a whole number, got {value!r}")
    if _unit_interval(dotted) and not 0 <= value <= 1:
        raise ConfigError(f"{path}: {dotted} is a share: must be between 0 and 1, got {value!r}")
    if value < 0:  # no threshold is negative: a limit below 0 flags every step
        raise ConfigError(f"{path}: {dotted} must be at least 0, got {value!r}")
    return int(value) if isinstance(default, int) else value


def _check_type(path: Path, dotted: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {dotted} must be true or false, got {_short(value)}")
        return value
    if isinstance(default, (int, float)):
        return _check_number(path, dotted, default, value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {dotted} must be a string, got {_short(value)}")
        return value
    if isinstance(default, list):
        kinds = {type(v) for v in default}
        if not isinstance(value, list) or (
                len(kinds) == 1 and not all(isinstance(v, tuple(kinds)) for v in value)):
            what = f"a list of {kinds.pop().__name__}" if len(kinds) == 1 else "a list"
            raise ConfigError(f"{path}: {dotted} must be {what}, got {_short(value)}")
        return value
    return value


def _check_suppress(path: Path, user: dict[str, Any]) -> dict[str, list[str]]:
    """``suppress`` entries: flag kind -> list of the flag kinds that hide it."""
    from monitor.records import FLAG_KINDS

    known = set(FLAG_KINDS)
    for kind, causes in user.items():
        dotted = f"suppress.{kind}"
        if kind not in known:
            raise ConfigError(f"{path}: {dotted}: {kind!r} is not a flag kind")
        if not isinstance(causes, list) or not all(isinstance(c, str) for c in causes):
            raise ConfigError(f"{path}: {dotted} must be a list of flag kinds, "
                              f"got {_short(causes)}")
        unknown = [c for c in causes if c not in known]
        if unknown:
            raise ConfigError(f"{path}: {dotted}: {unknown[0]!r} is not a flag kind")
    return user


def _overlay(path: Path, base: dict[str, Any], user: dict[str, Any], prefix: str = "") -> None:
    for key, value in user.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            known = ", ".join(sorted(base)) if len(base) < 25 else f"{len(base)} known keys"
            raise ConfigError(f"{path}: unknown key {_short(dotted)} (known: {known})")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {dotted} must be a mapping, got {_short(value)}")
            if prefix == "" and key == "suppress":
                base[key] = {**base[key], **_check_suppress(path, value)}
                continue
            _overlay(path, base[key], value, dotted + ".")
        else:
            base[key] = _check_type(path, dotted, base[key], value)


@functools.lru_cache(maxsize=1)
def _defaults() -> dict:
    """The packaged defaults, parsed once per process (YAML parsing costs ~80 ms)."""
    return _read_yaml(DEFAULTS_PATH)


def load_config(path: str | None = None) -> Config:
    """Load the defaults, then overlay the user's YAML at ``path`` if given (any subset of keys).

    Raises ``ConfigError`` (one line, naming the file) for a missing or unreadable file, bad
    YAML, an unknown section or key, or a value of the wrong type.
    """
    base = copy.deepcopy(_defaults())
    if path is not None:
        user_path = Path(path)
        _overlay(user_path, base, _read_yaml(user_path))
    return Config(base)
