"""How each verl release prints a step: number format, Ray prefix, and which keys exist.

Facts from VERL_SIGNALS.md sections 1 and 3. A :class:`VersionProfile` answers every
"does this release log X, and how" question the simulator asks; :func:`format_value`
renders one number the way that release's console logger does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VersionProfile:
    """What one verl release logs and how it prints it.

    ``number_format``: ``fixed3`` (every value with 3 decimals, up to 0.4.1), ``repr``
    (Python repr, 0.5-0.8) or ``numpy`` (numpy-2 scalars print as ``np.float64(...)``, 0.9+).
    ``reshard``: ``none`` (hidden in ``timing_s/gen``), ``nested`` (``timing_s/reshard`` and
    ``timing_s/generate_sequences`` inside gen), ``derived`` (gen minus the agent loop's slowest
    ``generate_sequences``) or ``update_weights`` (its own timer after ``update_actor``).
    """

    version: str
    number_format: str
    ray_actor: str
    ray_ip: bool = False
    ansi: bool = False
    reshard: str = "none"
    memory_prefix: str = "perf/"
    agent_loop: bool = False
    aborted_ratio: bool = False
    mfu_key: str = "perf/mfu/actor"
    mfu_infer: bool = False
    kl_key: str = "actor/reward_kl_penalty"
    entropy_key: str = "actor/entropy"

    @property
    def reshard_after_update(self) -> bool:
        """True when the weight sync runs after ``update_actor`` (0.7.1+), not before gen."""
        return self.reshard == "update_weights"


VERSIONS: dict[str, VersionProfile] = {
    "0.2": VersionProfile(
        "0.2", "fixed3", "main_task", mfu_key="mfu/actor", kl_key="critic/kl",
        entropy_key="actor/entropy_loss",
    ),
    "0.3": VersionProfile(
        "0.3", "fixed3", "TaskRunner", kl_key="critic/kl", entropy_key="actor/entropy_loss"
    ),
    "0.4.0": VersionProfile("0.4.0", "fixed3", "TaskRunner", entropy_key="actor/entropy_loss"),
    "0.4.1": VersionProfile("0.4.1", "fixed3", "TaskRunner", reshard="nested"),
    "0.5": VersionProfile("0.5", "repr", "TaskRunner", reshard="nested"),
    "0.6": VersionProfile(
        "0.6", "repr", "TaskRunner", reshard="derived", agent_loop=True, aborted_ratio=True
    ),
    "0.7.0": VersionProfile(
        "0.7.0", "repr", "TaskRunner", reshard="derived", agent_loop=True, aborted_ratio=True,
        mfu_infer=True,
    ),
    "0.7.1": VersionProfile(
        "0.7.1", "repr", "TaskRunner", reshard="update_weights", agent_loop=True,
        aborted_ratio=True, mfu_infer=True,
    ),
    "0.8": VersionProfile(
        "0.8", "repr", "TaskRunner", reshard="update_weights", memory_prefix="actor/perf/",
        agent_loop=True, aborted_ratio=True, mfu_infer=True,
    ),
    "0.9": VersionProfile(
        "0.9", "numpy", "TaskRunnerV1", ray_ip=True, ansi=True, reshard="update_weights",
        memory_prefix="actor/perf/", agent_loop=True, aborted_ratio=True, mfu_infer=True,
    ),
}


class UnknownVersion(ValueError):
    """A verl version the simulator does not model; the message lists the valid ones."""


def get_profile(version: str) -> VersionProfile:
    """The profile for ``version`` ("0.5.0" and "0.5" are the same); raises UnknownVersion."""
    key = version.strip()
    if key.startswith("v"):
        key = key[1:]
    if key not in VERSIONS and key.endswith(".0") and key[:-2] in VERSIONS:
        key = key[:-2]
    if key not in VERSIONS:
        raise UnknownVersion(
            f"unknown verl version {version!r}; valid: {', '.join(VERSIONS)}"
        )
    return VERSIONS[key]


def format_value(value: Any, fmt: str, numpy_scalar: bool = True) -> str:
    """Render one logged number as the console logger of that era does.

    ``numpy_scalar`` says whether verl holds the value as a numpy scalar (metrics computed
    with numpy) rather than a Python number (timers, counters); only 0.9+ shows the difference.
    """
    if isinstance(value, bool):
        if fmt == "fixed3":
            return f"{float(value):.3f}"
        if fmt == "numpy" and numpy_scalar:
            return "np.True_" if value else "np.False_"
        return repr(value)
    if fmt == "fixed3":
        return f"{float(value):.3f}"
    if isinstance(value, int):
        text = repr(value)
        return f"np.int64({text})" if (fmt == "numpy" and numpy_scalar) else text
    value = float(value)
    if math.isnan(value):
        text = "nan"
    elif math.isinf(value):
        text = "inf" if value > 0 else "-inf"
    else:
        text = repr(value)
    return f"np.float64({text})" if (fmt == "numpy" and numpy_scalar) else text


def ray_prefix(profile: VersionProfile, pid: int, ip: str) -> str:
    """The ``(TaskRunner pid=N)`` prefix Ray's log forwarding puts before driver lines."""
    inner = f"{profile.ray_actor} pid={pid}" + (f", ip={ip}" if profile.ray_ip else "")
    if profile.ansi:
        return f"\x1b[36m({inner})\x1b[0m "
    return f"({inner}) "
