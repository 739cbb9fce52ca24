"""Detector configuration: every threshold lives in ``defaults.yaml``; a user YAML overrides.

``load_config(path)`` reads the defaults and overlays the user's file section by section.
A key that is not in the defaults, or a value of the wrong type, is a ``ConfigError`` with a
one-line message naming the file and the key.
"""

from __future__ import annotations

import copy
import functools
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


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def _check_type(path: Path, dotted: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {dotted} must be true or false, got {value!r}")
        return value
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: {dotted} must be a number, got {value!r}")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {dotted} must be a string, got {value!r}")
        return value
    if isinstance(default, list):
        if not isinstance(value, list):
            raise ConfigError(f"{path}: {dotted} must be a list, got {value!r}")
        return value
    return value


def _overlay(path: Path, base: dict[str, Any], user: dict[str, Any], prefix: str = "") -> None:
    for key, value in user.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            known = ", ".join(sorted(base)) if len(base) < 25 else f"{len(base)} known keys"
            raise ConfigError(f"{path}: unknown key {dotted!r} (known: {known})")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {dotted} must be a mapping, got {value!r}")
            if prefix == "" and key == "suppress":
                base[key] = {**base[key], **value}
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
