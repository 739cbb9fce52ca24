"""The job's printed config for the live detectors' advice.

verl prints its whole resolved config when the run starts (``monitor.logs.job_config``);
``analyze`` reads it from the log's head, and so does the live monitor, through
:class:`JobConfigWatch`: it looks in the followed logs' heads until a config is there (at most
once every ``retry_s``), then keeps it. The flags' advice then names the knobs with the values
this job has ("ppo_micro_batch_size_per_gpu is 1 in this job") and never asks for a value the
job already set, and the trainer mode it names (``monitor.logs.modes.printed_mode``) decides
where the step keys cannot. A log that has none keeps the advice as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from monitor.logs.job_config import read_job_config_file


class JobConfigWatch:
    """The first config printed in one of ``logs``, read lazily and kept once found."""

    def __init__(self, logs: Sequence[str], retry_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logs = tuple(logs)
        self.retry_s = float(retry_s)
        self._clock = clock
        self._found: dict[str, Any] | None = None
        self._tried_at: float | None = None
        #: where the config was read from (None until found)
        self.source: str | None = None

    def config(self) -> dict[str, Any] | None:
        """The job's config as verl printed it (nested), or None while none was found."""
        if self._found is not None or not self.logs:
            return self._found
        now = self._clock()
        if self._tried_at is not None and now - self._tried_at < self.retry_s:
            return None
        self._tried_at = now
        for path in self.logs:
            got = read_job_config_file(path)
            if got:
                self._found, self.source = got, path
                break
        return self._found
