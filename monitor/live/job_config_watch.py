"""The job's printed config for the live detectors, the live goodput, wandb and the store.

verl prints its whole resolved config when the run starts (``monitor.logs.job_config``);
``analyze`` reads it from the log's head, and so does the live monitor, through
:class:`JobConfigWatch`: it looks in the followed logs' heads until a config is there (at most
once every ``retry_s``), then keeps it; a log whose first step came with no config before
it is not read again (verl prints the config before step 1), and a config caught while verl was
still printing it is read again until it is whole. The flags' advice then names the
knobs with the values this job has ("ppo_micro_batch_size_per_gpu is 1 in this job") and never asks for a value the
job already set, and the trainer mode it names (``monitor.logs.modes.printed_mode``) decides
where the step keys cannot: for the detectors, the goodput counter (``ViewContext.job_config``)
and the wandb sink alike. Once found it is handed to ``on_found`` (the live monitor saves it in
the run store's meta, key ``job_config``, where the dashboard reads it: :func:`storable`).
A log that has none keeps the advice as it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from monitor.logs.job_config import scan_head

#: The run store's meta key that holds the printed config (``RunStore.meta()``).
META_KEY = "job_config"


def _cut_short(value: Any) -> bool:
    """Whether a printed value holds ``...`` (verl's print cut it: its value is not known)."""
    if value is Ellipsis:
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_cut_short(v) for v in value)
    return False


def storable(config: Mapping[str, Any]) -> dict[str, Any]:
    """The printed config as JSON keeps it: tuples and sets as lists, keys as text, and a
    value cut short (``...``) left out, as ``monitor.logs.job_config.flatten`` leaves it out
    (not known). Read back from the store it gives the same trainer mode and advice."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out[str(key)] = storable(value)
        elif not _cut_short(value):
            out[str(key)] = list(value) if isinstance(value, (tuple, set, frozenset)) else value
    return out


class JobConfigWatch:
    """The first config printed in one of ``logs``, read lazily and kept once found.

    ``on_found`` (may be set after construction) is called once with the config when it is
    found; an exception there is not this watch's: it propagates to the caller of
    :meth:`config`, which has it again on its next call. Safe to call from several threads
    (the detector loop and the goodput counter both ask)."""

    def __init__(self, logs: Sequence[str], retry_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_found: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.logs = tuple(logs)
        self.retry_s = float(retry_s)
        self._clock = clock
        self._found: dict[str, Any] | None = None
        self._final = False  # a config read whole (or its end seen): not read again
        self._tried_at: float | None = None
        self._settled: set[str] = set()  # logs whose head holds no config, for good
        self._lock = threading.Lock()
        self.on_found = on_found
        self._told = False
        #: where the config was read from (None until found)
        self.source: str | None = None
        #: the Ray actor names of the heads read (which trainer's driver printed them)
        self.actors: frozenset[str] = frozenset()

    def config(self) -> dict[str, Any] | None:
        """The job's config as verl printed it (nested), or None while none was found."""
        with self._lock:
            if not self._final and self.logs:
                self._look()
            if self._found is not None and not self._told and self.on_found is not None:
                self.on_found(self._found)
                self._told = True
            return self._found

    def _look(self) -> None:
        now = self._clock()
        if self._tried_at is not None and now - self._tried_at < self.retry_s:
            return
        self._tried_at = now
        for path in self.logs:
            if path in self._settled:
                continue  # a step came before any config there: it is not read again
            head = scan_head(path)
            got, final = head.config, head.final
            self.actors |= head.actors
            if got:
                if got != self._found:  # caught half-printed before: tell the whole again
                    self._told = False
                self._found, self.source, self._final = got, path, final
                return
            if final:
                self._settled.add(path)
