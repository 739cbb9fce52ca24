"""Multi-line constructs of a console log: validation metrics printed by pprint over several
lines, Python tracebacks (chained, and Ray's re-raised ones), and HybridEngine switches (the
``[HybridEngine]`` lines of one resharding, timed from the first to the last)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor.logs.exception_lines import ExceptionLine, exception_line, is_frame_line
from monitor.logs.failure_lines import is_oom, traceback_origin
from monitor.logs.stats import SAMPLE_CHARS, Item
from monitor.logs.values import to_number
from monitor.records import Event

VALIDATION_START = ("Initial validation metrics:", "Final validation metrics:")
TRACEBACK_START = "Traceback (most recent call last):"
_CHAIN_MARKERS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
_CARETS_RE = re.compile(r"[~^]+")
_PPRINT_PAIR_RE = re.compile(r"['\"]([^'\"]+)['\"]\s*:\s*((?:np\.\w+\()?[-+\w.]+\)?)")
#: Lines one block may hold.
_MAX_BLOCK_LINES = 10000
#: Detail lines kept after an exception (omegaconf's ``full_key: x``, ``object_type=dict``).
_MAX_DETAIL = 6
_DETAIL_RE = re.compile(r"^[\w .]+(?::|=)")
#: Exceptions one chain keeps.
_MAX_CHAIN = 16
#: A logger's prefix before a traceback's header (``ERROR:2026-03-26 21:59:41,526:Traceback``,
#: ``[ERROR] ... Traceback``): the code that logged it caught the exception. (``Original
#: Traceback`` is torch's DataLoader re-raising a worker's exception: not caught.)
_LOGGER_PREFIX_RE = re.compile(r"^\W*(?:ERROR|WARNING|WARN|INFO|DEBUG|CRITICAL)\b.*Traceback")

#: Called with a traceback's exception line, its time, the output list and the block's lines.
ExceptionHook = Callable[[str, "float | None", list[Item], list[str]], None]


@dataclass
class _Block:
    """A multi-line construct in progress."""

    kind: str
    time: float | None
    lines: list[str] = field(default_factory=list)
    last_time: float | None = None
    exception: str | None = None
    awaiting_chain: bool = False
    chained: int = 0
    #: tracebacks: the step the failure is placed at (the last step or bar count before it)
    step: int | None = None
    headless: bool = False
    logged: bool = False
    after_frame: bool = False
    exceptions: list[str] = field(default_factory=list)
    detail: list[str] = field(default_factory=list)


class BlockReader:
    """The validation block or traceback open in a log, fed line by line."""

    def __init__(self, on_exception: ExceptionHook) -> None:
        self._block: _Block | None = None
        self._on_exception = on_exception

    @property
    def open(self) -> bool:
        """Whether a block is in progress."""
        return self._block is not None

    def start_traceback(self, text: str, when: float | None, out: list[Item],
                        step: int | None, *, headless: bool = False) -> None:
        """Close the open block, open a traceback at its first line: the ``Traceback (most
        recent call last):`` header, or (``headless``) a frame line whose header the text does
        not have. A header after other text on its line (``ERROR:...:Traceback``) is a logger's:
        the code that printed it caught the exception."""
        self.close(out, step)
        block = _Block("traceback", when, [text], step=step, headless=headless)
        if headless:
            block.after_frame = True
        else:
            block.logged = _LOGGER_PREFIX_RE.match(text.lstrip()) is not None
        self._block = block

    def start_exception(self, text: str, found: ExceptionLine, when: float | None,
                        out: list[Item], step: int | None) -> None:
        """Close the open block, open a traceback at an exception's line printed without its
        header (a quote, or Ray's ``RayTaskError(X): ray::Task()`` before the worker's frames):
        the lines after it (the message's detail, Ray's re-raised frames) still join it."""
        self.close(out, step)
        block = _Block("traceback", when, [], step=step, headless=True)
        self._block = block
        self._exception(block, text.strip(), found, when, out)

    def start_validation(self, text: str, when: float | None, out: list[Item],
                         step: int | None) -> None:
        """Close the open block, open a validation block (closed at once when it fits on its
        first line)."""
        self.close(out, step)
        self._block = _Block("validation", when, [text])
        if _validation_complete(text, first=True):
            self.close(out, step)

    def feed(self, text: str, when: float | None, out: list[Item], step: int | None) -> bool:
        """Feed a line to the open block; False when the line is not part of it (the block is
        then closed and the caller handles the line normally)."""
        block = self._block
        assert block is not None
        if block.kind == "validation":
            continues = text.startswith(" ") or (len(block.lines) == 1 and text.startswith("{"))
            if (continues and not text.lstrip().startswith("step:")
                    and len(block.lines) < _MAX_BLOCK_LINES):
                block.lines.append(text)
                if _validation_complete(text, first=False):
                    self.close(out, step)
                return True
            self.close(out, step)
            return False
        return self._feed_traceback(block, text, when, out, step)

    def _feed_traceback(self, block: _Block, text: str, when: float | None, out: list[Item],
                        step: int | None) -> bool:
        stripped = text.strip()
        if len(block.lines) > _MAX_BLOCK_LINES:
            self.close(out, step)
            return False
        if block.awaiting_chain:
            return self._after_exception(block, text, stripped, when, out, step)
        if text.startswith("step:"):
            self.close(out, step)
            return False
        if is_frame_line(stripped):
            block.lines.append(text if text[:1].isspace() else "  " + stripped)
            block.after_frame = True
            return True
        if block.after_frame:
            block.after_frame = False
            if stripped and exception_line(stripped) is None and not stripped.startswith(
                    _CHAIN_MARKERS) and TRACEBACK_START not in stripped:
                # the frame's source line (a date prefix may have taken its indent)
                block.lines.append(text if text[:1].isspace() else "    " + stripped)
                return True
        if (not stripped or text[0].isspace() or stripped.startswith(TRACEBACK_START)
                or _CARETS_RE.fullmatch(stripped)):
            block.lines.append(text)
            return True
        if stripped.startswith(_CHAIN_MARKERS):
            block.chained += 1
            return True
        found = exception_line(stripped)
        if block.headless and found is None and not self._ends_headless(stripped):
            # frames without a header, then a line that is no exception: not a traceback's end
            self.close(out, step)
            return False
        # The first unindented line ends the traceback: the exception itself.
        self._exception(block, stripped, found, when, out)
        return True

    def _after_exception(self, block: _Block, text: str, stripped: str, when: float | None,
                         out: list[Item], step: int | None) -> bool:
        """A line after a traceback's exception: a chained traceback, Ray's re-raised frames,
        the message's detail, the wrapped exception Ray prints after ``RayTaskError(X)``; else
        the traceback is over (False)."""
        if not stripped:
            return True
        if stripped.startswith(_CHAIN_MARKERS) or stripped.startswith(TRACEBACK_START):
            block.awaiting_chain = False
            block.chained += 1
            block.lines.append(stripped)
            return True
        if is_frame_line(stripped):
            # Ray re-raises a worker's exception with the worker's own frames after it
            # (RayTaskError(X): ray::...): the traceback goes on to the root cause.
            block.awaiting_chain = False
            block.chained += 1
            block.lines.append(text if text[:1].isspace() else "  " + stripped)
            block.after_frame = True
            return True
        if _CARETS_RE.fullmatch(stripped):
            # Python 3.11+ marks the failing expression (^^^^, ~~^^); Ray prints those of the
            # driver's frames under its re-raised line
            block.lines.append(text)
            return True
        if text[:1] == "\t":  # Ray's detail lines (class_name:, pid:, ip:)
            block.lines.append(text)
            return True
        if text[:1].isspace() and len(block.detail) < _MAX_DETAIL and _DETAIL_RE.match(stripped):
            block.detail.append(stripped[:SAMPLE_CHARS])  # omegaconf's full_key:, object_type=
            block.lines.append(text)
            return True
        found = exception_line(stripped)
        if found is not None and found.typed and len(block.exceptions) < _MAX_CHAIN:
            # Ray prints the wrapped exception's own line after RayTaskError(X): ray::Task()
            self._exception(block, stripped, found, when, out)
            return True
        self.close(out, step)
        return False

    @staticmethod
    def _ends_headless(stripped: str) -> bool:
        """Whether a line that is no ``Type: message`` still ends frames printed without their
        header: an out-of-memory message (``cuda error: out of memory at ...``)."""
        return is_oom(stripped)

    def _exception(self, block: _Block, stripped: str, found: ExceptionLine | None,
                   when: float | None, out: list[Item]) -> None:
        block.exception = stripped
        block.exceptions.append(stripped[:SAMPLE_CHARS * 2])
        block.lines.append(stripped)
        block.awaiting_chain = True
        block.after_frame = False
        self._on_exception(stripped, when, out, block.lines)

    def close(self, out: list[Item], step: int | None) -> None:
        """End the open block (if any): a ``validation`` or ``traceback`` event at ``step``."""
        block = self._block
        if block is None:
            return
        self._block = None
        if block.kind == "validation":
            metrics = _pprint_metrics(block.lines)
            which = "final" if block.lines[0].find("Final validation") >= 0 else "initial"
            out.append(
                Event(
                    "validation",
                    block.time,
                    step,
                    block.lines[0][:SAMPLE_CHARS],
                    {"metrics": metrics, "origin": f"{which}_block"},
                )
            )
            return
        exception = block.exception or ""
        if block.headless and not exception:
            return  # frames without a header and without an exception: nothing was raised
        found = exception_line(exception) if exception else None
        exc_type = exception.split(":", 1)[0].strip() if exception else ""
        if found is not None and not found.typed:
            exc_type = ""  # a message printed without its type
        data: dict[str, Any] = {"exception": exception, "type": exc_type,
                                "lines": len(block.lines)}
        if block.chained:
            data["chained"] = block.chained
        if len(block.exceptions) > 1:
            data["exceptions"] = block.exceptions  # the chain, as printed (root cause first)
        if block.detail:
            data["detail"] = block.detail
        if block.headless:
            data["headless"] = True  # no "Traceback (most recent call last):" header
        if block.logged:
            data["logged"] = True
        data.update(traceback_origin(block.lines))  # the Ray task, the deepest frames
        at = block.step if block.step is not None else step
        out.append(Event("traceback", block.time, at, exception, data))


class HybridSwitch:
    """The ``[HybridEngine]`` lines of one switch between training and generation."""

    def __init__(self) -> None:
        self._switch: _Block | None = None

    @property
    def open(self) -> bool:
        """Whether a switch is in progress."""
        return self._switch is not None

    def feed(self, text: str, when: float | None, out: list[Item],
             step: int | None) -> float | None:
        """Add a ``[HybridEngine]`` line; a ``Resharding`` line starts a new switch. Returns the
        seconds of a switch this line closed (None otherwise)."""
        seconds = None
        if self._switch is not None and "Resharding" in text:
            seconds = self.close(out, step)
        switch = self._switch
        if switch is None:
            self._switch = _Block("hybrid", when, [text], last_time=when)
            return seconds
        switch.lines.append(text)
        if when is not None:
            switch.last_time = when
        return seconds

    def close(self, out: list[Item], step: int | None) -> float | None:
        """End the switch (if any): a ``reshard`` event; returns its seconds when timed."""
        switch = self._switch
        if switch is None:
            return None
        self._switch = None
        seconds: float | None = None
        if switch.time is not None and switch.last_time is not None and len(switch.lines) > 1:
            seconds = max(0.0, switch.last_time - switch.time)
        data = {"seconds": seconds, "source": "hybrid_engine", "lines": len(switch.lines)}
        out.append(Event("reshard", switch.time, step, switch.lines[0], data))
        return seconds


def _validation_complete(text: str, *, first: bool) -> bool:
    s = text.strip()
    if first:
        if s.startswith("("):
            return s.endswith(")")
        if s[:1] in ("'", '"'):
            return len(s) > 1 and s.endswith(s[0])
        if "{" in s:
            return s.count("{") <= s.count("}")
        return False
    return s.endswith(")") or s.endswith("}") or s.endswith("}'") or s.endswith('}"')


def _pprint_metrics(lines: list[str]) -> dict[str, Any]:
    """Metric pairs from a pprint validation block (a dict, or pprint's split-string form)."""
    text = "\n".join(line.strip() for line in lines)
    if text[:1] in ("(", "'", '"'):
        try:
            value = ast.literal_eval(text)
            if isinstance(value, str):
                text = value
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
    metrics: dict[str, Any] = {}
    for key, raw in _PPRINT_PAIR_RE.findall(text):
        num = to_number(raw)
        if num is not None:
            metrics[key] = num
    return metrics
