"""One round of py-spy stacks of the job's local processes, judged, as a ``hang_dump`` event.

The exporter's ``flight_recorder`` collector calls :func:`stack_round` when the log falls
silent: the job's processes (``monitor.hang.procs.job_process_tree``) are dumped with py-spy
(every thread), each dump is classified (``monitor.hang.where``) and the node's verdict goes
into the event the ``hang`` detector reads. With a folder, each dump is also written as
``<unix_ts>_<role>_<pid>.txt`` (safely: ``monitor.hang.stack_files``) so that ``verl-monitor
analyze --stacks DIR`` can judge them offline (:func:`read_stacks_dir`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from monitor.hang.procs import GoneProcess, JobProcess, alive, is_monitor, proc_info
from monitor.hang.pyspy import dump_many
from monitor.hang.stack_files import StackFolder, UnsafeFolder
from monitor.hang.where import Verdict, Where, classify, gone_where, judge
from monitor.logs.safe_read import Unreadable, read_capped, walk_files
from monitor.records import Event

#: The largest py-spy dump read: a real one is 1-10 KB (every thread of a process).
MAX_STACK_BYTES = 4 * 2**20
_NAME = re.compile(r"^(?P<ts>\d+(?:\.\d+)?)_(?P<role>[A-Za-z_]+)_(?P<pid>\d+)\.txt$")


@dataclass
class StackRound:
    """What one round saw: each process's place, the verdict, and what could not be read."""

    wheres: list[Where] = field(default_factory=list)
    verdict: Verdict | None = None
    gone: list[Where] = field(default_factory=list)  # the job's processes gone in the silence
    problems: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_event(self, when: float, node: str) -> Event:
        """The ``hang_dump`` event (method ``py-spy``; data ``where``: the verdict)."""
        v = self.verdict or judge(self.wheres, self.gone)
        collective = {str(w.pid): f"{w.frame}" for w in self.wheres
                      if w.place == "collective" and w.frame is not None}
        culprits = [{"rank": -1 if w.rank is None else w.rank, "reason": w.describe(),
                     "pid": w.pid, "node": w.node or node, "gpu": w.gpu, "frame": str(w.frame) if w.frame else "", "pg": "",
                     "collective": "", "seq": None} for w in (v.who if v.stuck else [])]
        message, where = v.summary(), v.to_dict()
        if not self.wheres and not self.gone and self.problems:  # why there is no stack
            message = "no stacks: " + "; ".join(dict.fromkeys(self.problems.values()))[:600]
            where["place"] = ""  # no place read: no advice of a place
        return Event("hang_dump", when, message=message, data={
            "method": "py-spy", "seconds": round(self.seconds, 3), "node": node,
            "waiting": collective, "culprits": culprits, "where": where,
            "problems": dict(self.problems)})


def gone_wheres(gone: Iterable[GoneProcess], since: float | None, node: str = ""
                ) -> list[Where]:
    """The gone processes as ``Where``s (place ``gone``), timed from ``since`` (the last
    step's end) to when each was last seen alive."""
    return [gone_where(g.proc.pid, g.proc.role, node,
                       None if since is None else g.last_alive - since, g.gpu, g.rank)
            for g in gone]


def stack_round(procs: Iterable[JobProcess], node: str = "", exe: str | None = None,
                timeout_s: float = 10.0, save_dir: str | Path | StackFolder | None = None,
                gone: Iterable[Where] = (), since: float | None = None,
                nonblocking: bool = False) -> StackRound:
    """py-spy each process (all at once, within ``timeout_s``), classify it, judge the node
    (with ``gone``, the job's processes that went away in the silence); dumps saved to
    ``save_dir`` (a :class:`StackFolder`: created safely, see ``monitor.hang.stack_files``). A
    process that exits before its dump is gone too, timed from ``since`` (the last step's end)
    when given; a PID reused by another process meanwhile (another start time) is not read."""
    t0 = time.monotonic()
    out = StackRound(gone=list(gone))
    now = time.time()
    procs = [p for p in procs if _same_process(p)]
    texts = dump_many([p.pid for p in procs], timeout_s, exe, nonblocking=nonblocking)
    folder = StackFolder(Path(save_dir)) if isinstance(save_dir, (str, Path)) else save_dir
    for p in procs:
        text, why = texts.get(p.pid, ("", "no answer"))
        if why and not alive(p.pid):  # found a moment ago, gone before its dump
            out.gone.append(gone_where(p.pid, p.role, node,
                                       None if since is None else now - since))
            continue
        if why:
            out.problems[f"py-spy PID {p.pid}"] = why
            continue
        out.wheres.append(classify(text, role=p.role, node=node, pid=p.pid))
        if folder is not None:
            try:
                folder.save(now, p.role, p.pid, text)
            except OSError as exc:
                out.problems["stacks folder"] = str(exc) if isinstance(exc, UnsafeFolder) \
                    else f"{folder.path}: {exc.strerror or exc}"
    out.verdict = judge(out.wheres, out.gone)
    out.seconds = time.monotonic() - t0
    return out


def _same_process(p: JobProcess) -> bool:
    """False when ``p``'s PID now names another process (another start time)."""
    if p.start is None:
        return True
    info = proc_info(p.pid)
    return info is None or info.start == p.start


_HEADER = re.compile(r"^Process \d+: (?P<cmdline>.*)$", re.M)


def _is_monitor_dump(text: str) -> bool:
    """Whether a py-spy dump is of the monitor itself (its header's command line)."""
    m = _HEADER.search(text[:4096])
    return bool(m and is_monitor(m.group("cmdline")))


def read_stacks_dir(folder: str | Path, node: str = "",
                    problems: list[str] | None = None) -> list[tuple[float, list[Where]]]:
    """The rounds saved in ``folder`` (files ``<unix_ts>_<role>_<pid>.txt``), oldest first:
    (time, each process's place). Dumps a second apart belong to one round; other files are
    skipped. The folder is walked without recursion and without following links, and each dump
    read like the log (``monitor.logs.safe_read``): a FIFO, a device, a link out of the folder
    or a file over ``MAX_STACK_BYTES`` is not read, and said in ``problems``."""
    rounds: list[tuple[float, list[Where]]] = []
    entries = []
    for path in walk_files(folder, lambda name: _NAME.match(name) is not None):
        m = _NAME.match(path.name)
        if m:
            entries.append((float(m.group("ts")), m.group("role"), int(m.group("pid")), path))
    for ts, role, pid, path in sorted(entries):
        try:
            text = read_capped(path, MAX_STACK_BYTES, folder).decode("utf-8", "replace")
        except Unreadable as exc:
            if problems is not None:
                problems.append(str(exc))
            continue
        if _is_monitor_dump(text):
            continue  # the monitor's own exporter, saved by an older exporter: not the job's
        where = classify(text, role=role, node=node, pid=pid)
        if rounds and ts - rounds[-1][0] <= 5.0:
            rounds[-1][1].append(where)
        else:
            rounds.append((ts, [where]))
    return rounds


def stacks_report(folder: str | Path, node: str = "") -> tuple[dict, list[Event]]:
    """``analyze --stacks DIR``: the saved rounds judged again, as (a summary for the report:
    rounds, newest time, the newest round's verdict in words and as data; the rounds'
    ``hang_dump`` events for the detectors; ``node``: where the dumps were taken, when known).
    Raises ValueError when the folder has no dump."""
    problems: list[str] = []
    rounds = read_stacks_dir(folder, node, problems)
    if not rounds:
        raise ValueError(f"{folder}: no py-spy dump named <unix_ts>_<role>_<pid>.txt in it"
                         + (f" that can be read ({problems[0]})" if problems else ""))
    events = [StackRound(wheres, judge(wheres)).to_event(ts, node) for ts, wheres in rounds]
    newest = events[-1]
    return {"rounds": len(rounds), "time": newest.time, "summary": newest.message,
            "where": newest.data["where"], "problems": problems}, events
