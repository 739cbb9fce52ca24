"""What a log's metric keys, Ray actor names and number format say about its verl version."""

from __future__ import annotations

from monitor.logs.keys import guess_version
from monitor.logs.modes import trainer_mode
from monitor.logs.values import value_format

#: Step lines used to learn the number format (3-decimal / repr / numpy).
FORMAT_VOTES = 5


class Vocabulary:
    """The keys, actor names and number format seen so far in one log."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.prefixes: set[str] = set()
        self.number_format: str | None = None
        self._votes: dict[str, int] = {}
        self._voted_lines = 0
        self._cache: tuple[int, int, str | None, str] | None = None

    @property
    def voting(self) -> bool:
        """Whether step lines are still wanted to learn the number format."""
        return self._voted_lines < FORMAT_VOTES

    def vote(self, body: str, numpy_values: bool) -> None:
        """Let one console step line's body (``N - k:v - ...``) vote on the number format."""
        if numpy_values:
            fmt: str | None = "numpy"
        else:
            fmt = value_format([p.partition(":")[2].strip() for p in body.split(" - ")[1:]])
        if fmt is None:
            return
        self._voted_lines += 1
        self._votes[fmt] = self._votes.get(fmt, 0) + 1
        if "numpy" in self._votes:
            self.number_format = "numpy"
        else:
            self.number_format = max(self._votes, key=self._votes.__getitem__)

    @property
    def old_era_hint(self) -> str | None:
        """``"<=0.4.1"`` when the log looks like verl 0.4.1 or older (three-decimal values or
        the ``main_task`` actor), else None."""
        if self.number_format == "3dec" or "main_task" in self.prefixes:
            return "<=0.4.1"
        return None

    def version_guess(self) -> str:
        """The verl version range this log looks like (see ``keys.guess_version``)."""
        key = (len(self.keys), len(self.prefixes), self.number_format)
        cached = self._cache
        if cached is not None and cached[:3] == key:
            return cached[3]
        guess = guess_version(self.keys, self.prefixes, number_format=self.number_format)
        self._cache = (*key, guess)
        return guess

    def trainer_mode(self) -> str:
        """The verl trainer this log looks like (see ``modes.trainer_mode``), from every key
        seen so far."""
        return trainer_mode(self.keys)
