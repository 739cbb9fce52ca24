"""Single-line events of a console log: tqdm progress, weight syncs (``sync_weights success``),
memory reports, resumes and checkpoint loads, verl's skipped optimizer steps (``WARN: rank 0
grad_norm is not finite: nan``), and failures (OOM, NCCL, Ray, CUDA) with their repeats
dropped."""

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
#: verl's print when it skips an optimizer step (dp_actor/dp_critic/engine ``_optimizer_step``:
#: the actor's names its rank, the critic's and the engines' do not).
GRAD_NOT_FINITE = "grad_norm is not finite"
_GRAD_NOT_FINITE_RE = re.compile(
    r"WARN: (?:rank (\d+) )?grad_norm is not finite: (?:tensor\()?([-+\w.]+)")
_WORKER_RE = re.compile(r"\(([A-Za-z_][\w.:-]*) pid=(\d+)")
#: Distinct skipped-update lines kept between two step records (one a rank and worker).
_MAX_GRAD_LINES_PER_STEP = 16
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


def grad_not_finite_event(text: str, line: str, when: float | None,
                          step: int | None) -> Event | None:
    """A ``grad_not_finite`` event from verl's ``WARN: [rank R ]grad_norm is not finite: V``
    (verl then skips that optimizer step). ``data``: ``value`` (``nan``, ``inf``), ``rank``
    (the actor's line names it; None otherwise), ``role`` (``actor`` when a rank is named,
    else None: the critic's and the engines' lines look alike), ``worker`` and ``pid`` from
    Ray's ``(WorkerDict pid=N)`` prefix of ``line``. ``step`` is the last step recorded before
    it: the skipped update belongs to the step after that."""
    match = _GRAD_NOT_FINITE_RE.search(text)
    if match is None:
        return None
    rank = None if match.group(1) is None else int(match.group(1))
    data: dict[str, Any] = {"value": match.group(2).rstrip(",)"), "rank": rank,
                            "role": "actor" if rank is not None else None}
    worker = _WORKER_RE.search(line)
    if worker is not None:
        data["worker"], data["pid"] = worker.group(1), int(worker.group(2))
    return Event("grad_not_finite", when, step, text.strip()[:SAMPLE_CHARS], data)


class FailureLines:
    """OOM and failure events; the same failure printed again (by another rank, or again
    before the next step) is used but not repeated. The same holds for skipped optimizer
    steps: one event a worker and rank between two step records (each mini-batch prints
    again)."""

    def __init__(self) -> None:
        self._last_oom: str | None = None
        self._seen: set[tuple[Any, ...]] = set()
        self._grad_seen: set[tuple[Any, ...]] = set()

    def reset(self) -> None:
        """A step completed: later failures are new ones."""
        self._last_oom = None
        self._seen.clear()
        self._grad_seen.clear()

    def grad_not_finite(self, text: str, line: str, when: float | None, out: list[Item],
                        step: int | None, ip: str | None) -> bool:
        """A ``grad_not_finite`` event (``grad_not_finite_event``) for a new worker and rank
        since the last step record; True when the line is such a warning (new or not)."""
        event = grad_not_finite_event(text, line, when, step)
        if event is None:
            return False
        data = event.data
        key = (data.get("worker"), data.get("pid"), data["rank"], ip)
        if key in self._grad_seen or len(self._grad_seen) >= _MAX_GRAD_LINES_PER_STEP:
            return True
        self._grad_seen.add(key)
        if ip:
            data["ip"] = ip
        out.append(event)
        return True

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
