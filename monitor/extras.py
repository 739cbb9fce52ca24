"""Optional parts of the install ("extras") and the one-line message when one is missing.

The core install is what a training node needs: the exporter, the detectors and ``analyze``.
The Streamlit app, wandb and Slack come with extras (``pip install 'verl-monitor[dashboard]'``);
a command that needs one checks for it first and, when it is missing, stops with one line that
names the extra instead of a traceback.
"""

from __future__ import annotations

import importlib.util

#: Extra name -> the import names it provides (the third-party modules our code imports).
EXTRAS: dict[str, tuple[str, ...]] = {
    "dashboard": ("streamlit", "plotly", "httpx"),
    "wandb": ("wandb",),
    "slack": ("slack_sdk",),
}


class MissingExtra(RuntimeError):
    """A feature needs an extra that is not installed; ``str()`` is the line to print."""

    def __init__(self, feature: str, extra: str, missing: list[str]) -> None:
        self.feature = feature
        self.extra = extra
        self.missing = missing
        super().__init__(missing_extra_message(feature, extra))


def missing_extra_message(feature: str, extra: str) -> str:
    """The line that tells a user which extra to install for ``feature``."""
    return f"{feature} needs the '{extra}' extra: pip install 'verl-monitor[{extra}]'"


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (empty when it is installed)."""
    return [name for name in EXTRAS[extra] if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a blocked module (sys.modules[name] is None)
        return False


def require_extra(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` when any module of ``extra`` is missing.

    ``feature`` names what needs it, as the user would say it ("the dashboard",
    "--wandb"). The check only looks the modules up; it imports nothing.
    """
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(feature, extra, missing)


def explain_missing(extra: str, feature: str) -> str | None:
    """None when ``extra`` is installed, else the one line to print (see :class:`MissingExtra`)."""
    try:
        require_extra(extra, feature)
    except MissingExtra as exc:
        return str(exc)
    return None


def extra_for_module(module: str | None) -> str | None:
    """The extra that provides the top-level module ``module`` (None for any other module)."""
    top = (module or "").split(".")[0]
    for extra, modules in EXTRAS.items():
        if top in modules:
            return extra
    return None
