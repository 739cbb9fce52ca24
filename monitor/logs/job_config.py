"""The job's resolved config, as verl prints it when the run starts.

verl's ``TaskRunner.run`` prints ``pprint(OmegaConf.to_container(config, resolve=True))``
(verl/trainer/main_ppo.py): a Python dict, sorted by key and wrapped over many lines by
pprint, each line under Ray's ``(TaskRunner pid=N)`` prefix and perhaps ANSI colours:

    (TaskRunner pid=2741) {'actor_rollout_ref': {'actor': {'checkpoint': {...},
    (TaskRunner pid=2741)                                  'fsdp_config': {'param_offload': False,

``JobConfigReader`` collects those lines (``feed`` one line at a time) and reads the dict as
``ast.literal_eval`` would; a dict cut short (a ``...`` where a logger truncated it, the log
ending inside it, a value that is no literal) is closed where its last whole entry before the
first error ends, so what was printed is kept. A line holding only the comma after an entry (a
Ray prefix and ``,``) goes on with the dict; lines of other processes inside it do not end it.
Secrets (``*api_key*``, ``*token*``, ``*password*`` values, a URL's password) are masked as
the config is read, so no copy of it (the store's meta, ``export``, wandb) holds them.
``read_job_config_file`` scans the head of a log file. ``flatten`` gives dotted keys
(``actor_rollout_ref.actor.fsdp_config.param_offload``), the names advice uses.
"""

from __future__ import annotations

import ast
import bisect
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from monitor.logs.prefix import unwrap

#: Top-level sections of verl's config; a printed dict opening with one of them is the config.
_SECTIONS = ("'actor_rollout_ref'", "'algorithm'", "'critic'", "'custom_reward_function'",
             "'data'", "'global_profiler'", "'ray_init'", "'ray_kwargs'", "'reward'",
             "'reward_model'", "'trainer'")
#: Ray actors that print the job's config: verl's driver (``TaskRunner.run``, 0.3-0.8;
#: ``TaskRunnerV1``, 0.9; ``main_task``, 0.1-0.2). A dict another actor prints is not it.
DRIVERS = ("TaskRunner", "TaskRunnerV1", "main_task")
#: Sections a dict printed without any Ray prefix must have to be taken for the config.
_UNPREFIXED_MIN_SECTIONS = 3
#: A step record (verl's console ``step:N - ...`` line, its file logger's ``{"step": N, ...}``):
#: the config is printed before the first one (``TaskRunner.run``, before ``trainer.fit``).
_STEP_RE = re.compile(r'(?:^|\s)step:\d+ - |^\{"step": ?\d')
#: Lines one config may span (verl 0.5's config prints in about 400 lines).
MAX_LINES = 20_000
#: Characters of one config's text (verl's is about 30 KB); past it the print is not a config.
MAX_CHARS = 2 * 2**20
#: Bracket depth of one config (verl's nests about 6 deep); past it the print is not a config.
MAX_DEPTH = 32
#: Lines of other processes (Ray prints other actors' lines, warnings of the driver's own
#: stderr) tolerated in a row inside the dump before it is taken as ended.
FOREIGN_LINES = 64
#: Bytes of a log file read to find the config (it is printed before the first step).
HEAD_BYTES = 64 * 2**20

_OPEN = {"{": "}", "[": "]", "(": ")"}
#: How a line that goes on with the dict may begin without pprint's indent: a key, a closing
#: bracket, or the comma of an entry whose value ended the line before (verl 0.9's V1 trainer
#: under Ray: a line of only ``,`` after ``'project_name': '...'``).
_CONTINUES = ("'", '"', "}", "]", ")", ",")
#: What an indented continuation line of pprint's starts with after its indent: a key or a
#: string, a bracket, a number or a constant (not a traceback's ``File ...``).
_INDENTED_RE = re.compile(r"^\s+(?:['\"{}\[\]()]|-?\d|True\b|False\b|None\b|\.\.\.|inf\b|nan\b|,)")
#: A Ray prefix inside a line: the stream (the actor's stdout and stderr in one) glued another
#: write onto a line of the dump; what follows it is not the dict's.
_GLUED_RE = re.compile(r"\((?:[A-Za-z_][\w.:-]* )?pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)")
#: Keys whose values are secrets, masked wherever the config is kept or shown.
_SECRET_KEY_RE = re.compile(r"(?i)(?:api[_-]?key|token|secret|passw(?:or)?d|credential|auth)")
_URL_PASSWORD_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)@")
MASK = "***"


def _starts_config(text: str) -> bool:
    head = text.lstrip()
    return head.startswith("{'") and head[1:].startswith(_SECTIONS)


def _continues(text: str) -> bool:
    """Whether a line's text (its prefix taken off) goes on with a pprint dict: indented and
    starting with a value, or starting with a quote, a closing bracket or a comma."""
    return bool(_INDENTED_RE.match(text)) or text.startswith(_CONTINUES)


class _Scan:
    """Bracket depth of the text so far, outside string literals; where the last whole entry
    at each depth ended (to close a dict cut short). ``broken`` once the text is deeper than
    ``MAX_DEPTH`` or longer than ``MAX_CHARS``: no config is that."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.quote: str | None = None
        self.escape = False
        self.text: list[str] = []
        self.size = 0
        self.cuts: list[tuple[int, str]] = []  # (offset after an entry, closers needed)
        self.broken = False

    def add(self, chunk: str) -> None:
        if self.broken or self.size + len(chunk) > MAX_CHARS:
            self.broken = True
            return
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
                if len(self.stack) > MAX_DEPTH:
                    self.broken = True
                    return
            elif ch in "}])" and self.stack:
                self.stack.pop()
                self.cuts.append((base + i + 1, "".join(reversed(self.stack))))
            elif ch == ",":
                self.cuts.append((base + i, "".join(reversed(self.stack))))
        self.text.append(chunk)
        self.size += len(chunk)

    @property
    def closed(self) -> bool:
        return not self.stack and self.quote is None and self.size > 0 and not self.broken


class _NotLiteral(ValueError):
    """A node that is no printed value; ``at`` is its offset in the text."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


_NAMES = {"inf": float("inf"), "nan": float("nan"), "True": True, "False": False, "None": None}


def _offsets(text: str) -> list[int]:
    starts = [0]
    for n, ch in enumerate(text):
        if ch == "\n":
            starts.append(n + 1)
    return starts


def _value(node: ast.AST, lines: list[int]) -> Any:
    """The Python value of a printed literal (``ast.literal_eval``'s, and pprint's ``inf`` and
    ``nan``); raises ``_NotLiteral`` with the offset of the first node that is not one."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {_value(k, lines): _value(v, lines) for k, v in zip(node.keys, node.values,
                                                                    strict=True)
                if k is not None}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_value(e, lines) for e in node.elts]
        return items if isinstance(node, ast.List) else (
            tuple(items) if isinstance(node, ast.Tuple) else set(items))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand, lines)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    lineno = getattr(node, "lineno", 1)
    raise _NotLiteral(lines[min(lineno, len(lines)) - 1] + getattr(node, "col_offset", 0))


def _parse(text: str) -> tuple[dict[str, Any] | None, int | None]:
    """(the dict ``text`` prints, None) or (None, the offset of its first error)."""
    lines = _offsets(text)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, MemoryError, RecursionError, ValueError) as exc:
        lineno = getattr(exc, "lineno", None) or 1
        col = getattr(exc, "offset", None) or 1
        return None, lines[min(lineno, len(lines)) - 1] + max(0, col - 1)
    try:
        value = _value(tree.body, lines)
    except _NotLiteral as exc:
        return None, exc.at
    except (TypeError, RecursionError):  # an unhashable key, a value nested past the stack
        return None, 0
    return (value, None) if isinstance(value, dict) else (None, 0)


def mask_secrets(value: Any, key: str = "") -> Any:
    """``value`` with secrets masked: the value of a key that names one (``api_key``,
    ``token``, ``password``, ...) and the password of a URL (``scheme://user:PASS@host``)."""
    if isinstance(value, Mapping):
        return {k: mask_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v, key) for v in value]
    if isinstance(value, tuple):
        return tuple(mask_secrets(v, key) for v in value)
    if isinstance(value, str):
        if value and _SECRET_KEY_RE.search(key):
            return MASK
        return _URL_PASSWORD_RE.sub(lambda m: m.group(1) + MASK + "@", value)
    return value


class JobConfigReader:
    """Finds and reads verl's printed config in a log, fed one physical line at a time.

    The dump is the driver's (``DRIVERS``; a dict with no Ray prefix only if it has several
    of verl's sections); lines of other processes inside it (Ray forwards other actors' lines,
    the driver's own stderr warnings: up to ``FOREIGN_LINES`` in a row) do not end it.
    ``whole`` says whether it was read to its closing bracket; ``sections`` which top-level
    sections it has; ``ended`` whether its end was seen (closed, or cut short and followed by
    other lines), so a reader that saw the file end in the middle of it reads it again later.
    """

    def __init__(self) -> None:
        self._scan: _Scan | None = None
        self._actor: str | None = None  # the Ray actor that prints it (TaskRunner)
        self._lines = 0
        self._foreign = 0
        self.config: dict[str, Any] | None = None
        self.truncated = False
        self.ended = False
        #: a step record came before any config: none will follow (verl prints it first)
        self.after_steps = False
        #: the Ray actor names of the lines read (``TaskRunner``, ``TaskRunnerV1``): which
        #: trainer's driver printed them, for the premises
        self.actors: set[str] = set()

    @property
    def done(self) -> bool:
        """Whether the config has been read."""
        return self.config is not None

    @property
    def whole(self) -> bool:
        """Whether the config was read to its end (not cut short)."""
        return self.config is not None and not self.truncated

    @property
    def sections(self) -> list[str]:
        """The top-level sections the config read has."""
        return sorted(str(k) for k in (self.config or {}))

    def feed(self, line: str) -> bool:
        """Take one log line; True when it belonged to the config (or completed it)."""
        if self.config is not None:
            return False
        wrapped = unwrap(line)
        if wrapped.actor:
            self.actors.add(wrapped.actor)
        text = wrapped.text
        scan = self._scan
        if scan is None:
            if not _starts_config(text) or (wrapped.actor is not None
                                             and wrapped.actor not in DRIVERS):
                self.after_steps = self.after_steps or bool(_STEP_RE.search(text))
                return False
            scan = self._scan = _Scan()
            self._actor = wrapped.actor
            text = text.lstrip()
        elif (wrapped.actor != self._actor and self._actor is not None) or not _continues(text):
            self._foreign += 1  # another process's line, or the driver's own stderr
            if _STEP_RE.search(text) or self._foreign > FOREIGN_LINES:
                self.ended = True
                self.finish()
            return False
        self._foreign = 0
        glued = _GLUED_RE.search(text, 1)
        if glued is not None:  # another write of the stream glued onto the line: not the dict's
            text = text[:glued.start()]
        scan.add(text)
        self._lines += 1
        if scan.closed or scan.broken or self._lines >= MAX_LINES:
            self.ended = True
            self.finish()
        return True

    def finish(self) -> dict[str, Any] | None:
        """End the config being read (at the end of the log): it is read as far as it got."""
        scan = self._scan
        if scan is None or self.config is not None:
            return self.config
        self._scan = None
        if scan.broken:
            return None
        text = "".join(scan.text)
        found = _parse(text)[0] if scan.closed else None
        if found is None:
            found = _repair(text, scan)
            self.truncated = found is not None
        if found is not None and self._actor is None and len(
                set(map(repr, found)) & set(_SECTIONS)) < _UNPREFIXED_MIN_SECTIONS:
            found = None  # a dict printed by something else, not verl's driver
        self.config = None if found is None else mask_secrets(found)
        return self.config


#: Attempts to close a dict cut short, each before the first error of the last.
_REPAIRS = 8


def _repair(text: str, scan: _Scan) -> dict[str, Any] | None:
    """The dict cut short at its last whole entry before its first error (a trailing ``...``,
    a line cut off, a value that is no literal), brackets closed; None when nothing of it can
    be read. Each attempt cuts before the error the last one found, so a few suffice."""
    limit = len(text)
    for _ in range(_REPAIRS):
        k = bisect.bisect_right(scan.cuts, (limit, "\uffff")) - 1
        if k < 0:
            return None
        offset, closers = scan.cuts[k]
        found, error = _parse(text[:offset] + closers)
        if found is not None:
            return found
        limit = min(offset, error if error is not None else offset) - 1
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


class HeadScan(NamedTuple):
    """What a log's head says: the printed config (or None), whether that is final, and the
    Ray actor names of its lines (which trainer's driver printed them)."""

    config: dict[str, Any] | None
    final: bool
    actors: frozenset[str]
    #: whether the config was read to its end (not cut short)
    whole: bool = False

    def describe(self) -> dict[str, Any]:
        """What the head says of the config, for the report: ``found``, ``whole`` (read to its
        end) and the ``sections`` it has."""
        if self.config is None:
            return {"found": False}
        return {"found": True, "whole": self.whole,
                "sections": sorted(str(k) for k in self.config)}


def scan_head(path: str | os.PathLike[str], head_bytes: int = HEAD_BYTES) -> HeadScan:
    """The config printed in the first ``head_bytes`` of a log file and whether that is final:
    found whole or with its end seen, or a step record or ``head_bytes`` came first, so a
    later look at the same file finds no more. A config the file ends in the middle of (a live
    log caught while verl prints it) is returned as read so far, not final: it is read again.
    A file that cannot be read is (None, False, no actors)."""
    got = _scan_file(path, head_bytes)
    if got is None:
        return HeadScan(None, False, frozenset())
    reader, read = got
    final = (reader.done and (reader.whole or reader.ended)) or reader.after_steps \
        or read > head_bytes
    return HeadScan(reader.config, final, frozenset(reader.actors), reader.whole)


def scan_job_config_file(path: str | os.PathLike[str], head_bytes: int = HEAD_BYTES
                         ) -> tuple[dict[str, Any] | None, bool]:
    """(the config printed in a log's head or None, whether that is final): ``scan_head``."""
    head = scan_head(path, head_bytes)
    return head.config, head.final


def _scan_file(path: str | os.PathLike[str], head_bytes: int
               ) -> tuple[JobConfigReader, int] | None:
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
        return _read(lines()), read
    except OSError:
        return None


def describe_file(path: str | os.PathLike[str], head_bytes: int = HEAD_BYTES
                  ) -> dict[str, Any]:
    """What a log's head says of the job's printed config (``HeadScan.describe``)."""
    return scan_head(path, head_bytes).describe()


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
