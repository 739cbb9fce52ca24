"""Single-line events of a console log: tqdm progress, weight syncs (``sync_weights success``),
memory reports, resumes and checkpoint loads, and failures (OOM, NCCL, Ray, CUDA) with their
repeats dropped."""

from __future__ import annotations

import math
import re
from typing import Any

from monitor.logs.failure_lines import match_failure, oom_details, traceback_phase
from monitor.logs.stats import SAMPLE_CHARS, Item
from monitor.records import Event

_TQDM_RE = re.compile(
    r"Training Progress:\s*(\d+)%\|[^|]*\|\s*(\d+)/(\d+)\s*\[([\d:]+|\?)<([\d:]+|\?),"
    r"\s*(?:([\d.]+|\?)(s/it|it/s))?"
)
SET_STEP_RE = re.compile(r"Setting global step to (\d+)")
_LOAD_CKPT_RE = re.compile(r"Load from checkpoint folder:\s*(.*?)\s*$")
_SYNC_RE = re.compile(
    r"sync_weights success\.? cost ([-+\d.eE]+) seconds?(?:, pause:\s*([-+\d.eE]+) ?s)?"
    r"(?:, sync:\s*([-+\d.eE]+) ?s)?"
)
#: The fully-async trainer's own print of each weight sync.
_PARAM_SYNC_RE = re.compile(
    r"_fit_update_weights, timing_s/param_sync: ([-+\d.eE]+) ?s(?:econds)?"
    r".*?current_param_version: (\d+)"
)
_MEMORY_RE = re.compile(
    r"(?P<head>[^,]*?),\s*memory allocated \(GB\):\s*(?P<a>[-\d.eE+naif]+),\s*"
    r"memory reserved \(GB\):\s*(?P<r>[-\d.eE+naif]+)"
    r"(?:,\s*device memory used/total \(GB\):\s*(?P<u>[-\d.eE+naif]+)/(?P<t>[-\d.eE+naif]+))?"
)
_MEMORY_HEAD_RE = re.compile(r"(?:.*[\s:\]])?(\S+) (Before|After) (.+)$")
#: Failure lines remembered for de-duplication until the next step record.
_MAX_FAILURE_SIGNATURES = 512


def progress_event(text: str, when: float | None) -> Event | None:
    """A ``progress`` event from a tqdm ``Training Progress`` line (None when unreadable)."""
    match = _TQDM_RE.search(text)
    if match is None:
        return None
    pct, cur, tot, elapsed, eta, rate, unit = match.groups()
    s_per_it: float | None = None
    if rate not in (None, "?"):
        try:
            rate_val = float(rate)
        except ValueError:
            rate_val = 0.0
        if unit == "s/it":
            s_per_it = rate_val
        elif rate_val > 0:
            s_per_it = 1.0 / rate_val
    data = {
        "current": int(cur),
        "total": int(tot),
        "percent": int(pct),
        "elapsed_s": _clock_seconds(elapsed),
        "eta_s": _clock_seconds(eta),
        "s_per_it": s_per_it,
    }
    return Event("progress", when, int(cur), text, data)


def sync_event(text: str, when: float | None, step: int | None) -> Event | None:
    """A ``reshard`` event from a ``sync_weights success ... cost S seconds`` line or the
    fully-async trainer's ``_fit_update_weights, timing_s/param_sync: S seconds ...
    current_param_version: N`` (its step is N, the version the sync made)."""
    match = _PARAM_SYNC_RE.search(text)
    if match is not None:
        return Event("reshard", when, int(match.group(2)), text,
                     {"seconds": _float_or_none(match.group(1)), "pause_s": None,
                      "sync_s": None, "source": "fully_async_trainer"})
    match = _SYNC_RE.search(text)
    if match is None:
        return None
    data = {
        "seconds": _float_or_none(match.group(1)),
        "pause_s": _float_or_none(match.group(2)),
        "sync_s": _float_or_none(match.group(3)),
        "source": "parameter_synchronizer",
    }
    return Event("reshard", when, step, text, data)


def usable_seconds(value: float | None) -> float | None:
    """``value`` when it is a finite, non-negative number of seconds."""
    if value is not None and math.isfinite(value) and value >= 0:
        return value
    return None


def memory_event(text: str, when: float | None, step: int | None) -> Event | None:
    """A ``memory`` event from a ``..., memory allocated (GB): ...`` line."""
    match = _MEMORY_RE.search(text)
    if match is None:
        return None
    head = match.group("head").strip()
    data: dict[str, Any] = {
        "allocated_gb": _float_or_none(match.group("a")),
        "reserved_gb": _float_or_none(match.group("r")),
        "device_used_gb": _float_or_none(match.group("u")),
        "device_total_gb": _float_or_none(match.group("t")),
        "label": head,
    }
    head_match = _MEMORY_HEAD_RE.match(head)
    if head_match is not None:
        data["role"], data["when"], data["fn"] = head_match.groups()
    return Event("memory", when, step, text, data)


def checkpoint_load_event(text: str, when: float | None, step: int | None) -> Event:
    """A ``checkpoint_load`` event from a ``Load from checkpoint folder: PATH`` line."""
    match = _LOAD_CKPT_RE.search(text)
    path = match.group(1) if match else ""
    return Event("checkpoint_load", when, step, text, {"path": path})


class FailureLines:
    """OOM and failure events; the same failure printed again (by another rank, or again
    before the next step) is used but not repeated."""

    def __init__(self) -> None:
        self._last_oom: str | None = None
        self._seen: set[tuple[Any, ...]] = set()

    def reset(self) -> None:
        """A step completed: later failures are new ones."""
        self._last_oom = None
        self._seen.clear()

    def oom(self, text: str, when: float | None, out: list[Item], step: int | None,
            ip: str | None, frames: list[str] | None = None) -> None:
        """An ``oom`` event: sizes from the message, the phase from the traceback's frames."""
        if text == self._last_oom:
            return
        self._last_oom = text
        data: dict[str, Any] = oom_details(text)
        if frames:
            named = traceback_phase(frames)
            if named is not None:
                data["function"], data["phase"] = named
        if ip:
            data["ip"] = ip
        out.append(Event("oom", when, step, text, data))

    def failure(self, text: str, when: float | None, out: list[Item], step: int | None,
                ip: str | None) -> bool:
        """A failure event (NCCL timeout or error, Ray actor death, killed worker, CUDA error)
        for a line that reports one; True when the line reports one (new or repeated)."""
        found = match_failure(text)
        if found is None:
            return False
        if found.signature in self._seen:
            return True
        if len(self._seen) >= _MAX_FAILURE_SIGNATURES:
            self._seen.clear()
        self._seen.add(found.signature)
        data = found.data
        if ip:
            data["ip"] = ip
        out.append(Event(found.kind, when, step, text[:SAMPLE_CHARS * 2], data))
        return True


def _float_or_none(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _clock_seconds(text: str) -> float | None:
    if not text or text == "?":
        return None
    total = 0.0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return total
