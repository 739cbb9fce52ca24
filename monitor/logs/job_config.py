"""The job's resolved config, as verl prints it when the run starts.

verl's ``TaskRunner.run`` prints ``pprint(OmegaConf.to_container(config, resolve=True))``
(verl/trainer/main_ppo.py): a Python dict, sorted by key and wrapped over many lines by
pprint, each line under Ray's ``(TaskRunner pid=N)`` prefix and perhaps ANSI colours:

    (TaskRunner pid=2741) {'actor_rollout_ref': {'actor': {'checkpoint': {...},
    (TaskRunner pid=2741)                                  'fsdp_config': {'param_offload': False,

``JobConfigReader`` collects those lines (``feed`` one line at a time) and reads the dict with
``ast.literal_eval``; a dict cut short (a ``...`` where a logger truncated it, the log ending
inside it) is closed where its last whole entry ends, so what was printed is kept. A line
holding only the comma after an entry (a Ray prefix and ``,``) goes on with the dict.
``read_job_config_file`` scans the head of a log file. ``flatten`` gives dotted keys
(``actor_rollout_ref.actor.fsdp_config.param_offload``), the names advice uses.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from monitor.logs.prefix import unwrap

#: Top-level sections of verl's config; a printed dict opening with one of them is the config.
_SECTIONS = ("'actor_rollout_ref'", "'algorithm'", "'critic'", "'custom_reward_function'",
             "'data'", "'global_profiler'", "'ray_init'", "'ray_kwargs'", "'reward'",
             "'reward_model'", "'trainer'")
#: A step record (verl's console ``step:N - ...`` line, its file logger's ``{"step": N, ...}``):
#: the config is printed before the first one (``TaskRunner.run``, before ``trainer.fit``).
_STEP_RE = re.compile(r'(?:^|\s)step:\d+ - |^\{"step": ?\d')
#: Lines one config may span (verl 0.5's config prints in about 400 lines).
MAX_LINES = 20_000
#: Bytes of a log file read to find the config (it is printed before the first step).
HEAD_BYTES = 64 * 2**20

_OPEN = {"{": "}", "[": "]", "(": ")"}
#: How a line that goes on with the dict may begin without pprint's indent: a key, a closing
#: bracket, or the comma of an entry whose value ended the line before (verl 0.9's V1 trainer
#: under Ray: a line of only ``,`` after ``'project_name': '...'``).
_CONTINUES = ("'", "}", "]", ",")


def _starts_config(text: str) -> bool:
    head = text.lstrip()
    return head.startswith("{'") and head[1:].startswith(_SECTIONS)


class _Scan:
    """Bracket depth of the text so far, outside string literals; where the last whole entry
    at each depth ended (to close a dict cut short)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.quote: str | None = None
        self.escape = False
        self.text: list[str] = []
        self.size = 0
        self.cuts: list[tuple[int, str]] = []  # (offset after an entry, closers needed)

    def add(self, chunk: str) -> None:
        base = self.size
        for i, ch in enumerate(chunk):
            if self.quote is not None:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == self.quote:
                    self.quote = None
            elif ch in "'\"":
                self.quote = ch
            elif ch in _OPEN:
                self.stack.append(_OPEN[ch])
            elif ch in "}])" and self.stack:
                self.stack.pop()
                self.cuts.append((base + i + 1, "".join(reversed(self.stack))))
            elif ch == ",":
                self.cuts.append((base + i, "".join(reversed(self.stack))))
        self.text.append(chunk)
        self.size += len(chunk)

    @property
    def closed(self) -> bool:
        return not self.stack and self.quote is None and self.size > 0


def _literal(text: str) -> dict[str, Any] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class JobConfigReader:
    """Finds and reads verl's printed config in a log, fed one physical line at a time."""

    def __init__(self) -> None:
        self._scan: _Scan | None = None
        self._actor: str | None = None  # the Ray actor that prints it (TaskRunner)
        self._lines = 0
        self.config: dict[str, Any] | None = None
        self.truncated = False
        #: a step record came before any config: none will follow (verl prints it first)
        self.after_steps = False

    @property
    def done(self) -> bool:
        """Whether the config has been read."""
        return self.config is not None

    def feed(self, line: str) -> bool:
        """Take one log line; True when it belonged to the config (or completed it)."""
        if self.config is not None:
            return False
        wrapped = unwrap(line)
        text = wrapped.text
        scan = self._scan
        if scan is None:
            if not _starts_config(text):
                self.after_steps = self.after_steps or bool(_STEP_RE.search(text))
                return False
            scan = self._scan = _Scan()
            self._actor = wrapped.actor
            text = text.lstrip()
        elif self._actor is not None and wrapped.actor != self._actor:
            return False  # another actor's line between two of the config's: not the end
        elif not text.startswith(" ") and not text.lstrip().startswith(_CONTINUES):
            self.finish()  # a line that is not a continuation: the print was cut short
            return False
        scan.add(text)
        self._lines += 1
        if scan.closed:
            self.finish()
        elif self._lines >= MAX_LINES:
            self.finish()
        return True

    def finish(self) -> dict[str, Any] | None:
        """End the config being read (at the end of the log): it is read as far as it got."""
        scan = self._scan
        if scan is None or self.config is not None:
            return self.config
        self._scan = None
        text = "".join(scan.text)
        found = _literal(text) if scan.closed else None
        if found is None:
            found = _repair(text, scan)
            self.truncated = found is not None
        self.config = found
        return found


def _repair(text: str, scan: _Scan) -> dict[str, Any] | None:
    """The dict cut short at its last whole entry (a trailing ``...`` or a line cut off),
    brackets closed; None when nothing of it can be read."""
    for offset, closers in reversed(scan.cuts[-200:]):
        found = _literal(text[:offset] + closers)
        if found is not None:
            return found
    return None


def _read(lines: Iterable[str]) -> JobConfigReader:
    """The reader after ``lines``, stopped at the config's end or at the first step record
    before any config (verl prints its config before the first step)."""
    reader = JobConfigReader()
    for line in lines:
        reader.feed(line)
        if reader.done or reader.after_steps:
            break
    reader.finish()
    return reader


def read_job_config(lines: Iterable[str]) -> dict[str, Any] | None:
    """The first config verl printed in ``lines`` (None when there is none)."""
    return _read(lines).config


def scan_job_config_file(path: str | os.PathLike[str], head_bytes: int = HEAD_BYTES
                         ) -> tuple[dict[str, Any] | None, bool]:
    """(the config printed in the first ``head_bytes`` of a log file or None, whether that is
    final: found, or a step record or ``head_bytes`` came first, so a later look at the same
    file finds none either). A file that cannot be read is (None, False)."""
    read = 0

    def lines() -> Iterable[str]:
        nonlocal read
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                read += len(line)
                if read > head_bytes:
                    return
                yield line

    try:
        reader = _read(lines())
    except OSError:
        return None, False
    return reader.config, reader.done or reader.after_steps or read > head_bytes


def read_job_config_file(path: str | os.PathLike[str], head_bytes: int = HEAD_BYTES
                         ) -> dict[str, Any] | None:
    """The config printed in the first ``head_bytes`` of a log file (None when there is none,
    or the file cannot be read)."""
    return scan_job_config_file(path, head_bytes)[0]


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values: ``{'a': {'b': 1}}`` -> ``{'a.b': 1}`` (lists stay values);
    a value printed as ``...`` (cut short) is left out: it is not known."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if value is Ellipsis or (isinstance(value, (set, frozenset)) and Ellipsis in value):
            continue
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
