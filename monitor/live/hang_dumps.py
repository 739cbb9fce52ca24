"""Who holds the others when the job hangs, and where each process is: py-spy stacks of the
job's processes (on by default where py-spy is installed; ``--no-hang-pyspy`` turns them off)
and Flight Recorder dumps (``--fr-dir``).

Every ``WATCH_S`` seconds it finds the job's local processes, each proven the job's
(``monitor.hang.procs.job_process_tree``: under ``verl-monitor run``'s job, ``--hang-job-pid``
or the job's own raylet, as the job's user; hints alone prove nothing, and without a proof no
stack is taken and the log, the event and ``verlmon_hang_job_processes`` say why). Every
``hang.sample_s`` seconds through the whole run it reads the driver (``monitor.hang.sampler``:
py-spy without pausing it) and publishes a place held past its normal time as an over-event.
Every poll (1 s) the collector checks the silence cheaply (the newest steps in the window).
Once no step has arrived for ``hang.stack_multiple`` recent step times (at least
``hang.min_seconds``) it dumps each of the job's processes with py-spy (every thread, all at
once within ``pyspy_timeout_s``; none outlives the exporter), says where each is
(monitor/hang/where.py), adds the job's processes that went away since the last step (the
collector looks for them every ``WATCH_S`` seconds and checks every poll that each still runs:
``GoneWatch``; a rank killed or crashed is named as ``gone``) and publishes a ``hang_dump``
event with the verdict (again every
``hang.restack_s`` while no round found a process stuck); the ``hang`` detector makes it the
flag. Once the silence passes the ``hang`` detector's limit, or a ``hang``/``stalled`` flag is
open, it asks the local ranks for their Flight Recorder dumps, once per silence
(monitor/hang/request.py), compares them (monitor/hang/localize.py) and publishes who holds the
others. With ``--store``, each round's dumps are kept in ``<store>.stacks/`` for
``verl-monitor analyze --stacks``.

Exported, per rank and process group of the last round:
``verlmon_fr_collective_seq{rank, pg, state="enqueued|started|completed"}``,
``verlmon_fr_pending_info{rank, pg, collective, state, seq}``, ``verlmon_hang_culprit_info{rank,
pid, gpu, collective, seq, frame}``, ``verlmon_hang_where_info{role, pid, place, phase, frame, detail}``
(1 for the process named as stuck); and ``verlmon_hang_dump_rounds_total{method, result}``,
``verlmon_hang_dump_seconds`` (how long the last round took); ``verlmon_hang_held_seconds``,
``verlmon_hang_held_normal_seconds``, ``verlmon_hang_held_limit_seconds`` (the driver's current
place), ``verlmon_hang_pyspy_ready`` and ``verlmon_hang_pyspy_problem_info{problem}`` (py-spy
missing or without ptrace rights, with the fix), ``verlmon_hang_job_processes``. Every step that
cannot run (no FIFO, no permission, no py-spy) is in ``last_error`` in words and in the event's
``problems``; py-spy's own problems are also said once in the exporter's log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from monitor import metric_names as m
from monitor.config import load_config
from monitor.detect.hang import (
    between_step_allowance,
    gpu_states,
    recent_step_time,
    silence_limit,
    stack_limit,
)
from monitor.hang.dump import RankDump
from monitor.hang.dwell import HoldLimits
from monitor.hang.localize import Localization, RankInfo, localize_dumps
from monitor.hang.procs import (
    GoneWatch,
    JobProcess,
    JobTree,
    ProcessMap,
    job_process_tree,
    proc_info,
    run_parent,
    scan,
)
from monitor.hang.pyspy import INSTALL_FIX, find_pyspy, ptrace_problem, stop_all
from monitor.hang.request import find_pipes, request_dumps
from monitor.hang.sampler import HangState, HoldSampler
from monitor.hang.stack_files import StackFolder
from monitor.hang.stacks import StackRound, gone_wheres, stack_round
from monitor.live.live_view import FlagGroup, PollingView, ViewContext

log = logging.getLogger(__name__)

#: Label values are cut to this many characters (a frame's path can be long).
MAX_LABEL = 200
#: Seconds between two looks at the local GPUs' waiting signature.
WAIT_CHECK_S = 5.0
#: py-spy rounds at most per silence (one every ``hang.restack_s`` while none says stuck).
MAX_STACK_ROUNDS = 20
#: Seconds between two looks for the job's processes (their PIDs, GPUs and ranks), so that one
#: killed or crashed in a silence is known as gone (its liveness is checked every poll).
WATCH_S = 10.0


def add_flags(group: FlagGroup) -> None:
    """This view's flags: where the ranks' debug-info FIFOs are, and py-spy stacks or not."""
    add = group.add_argument
    add("--fr-dir", metavar="DIR", default=None,
        help="where the job's ranks keep their debug-info FIFOs "
        "(TORCH_NCCL_DEBUG_INFO_PIPE_FILE=DIR/pipe_): when the job hangs, each local rank is "
        "asked for its Flight Recorder once and the rank holding the others is named "
        "(docs/hangs.md)")
    add("--fr-pipe-prefix", default="pipe_", metavar="PREFIX",
        help="file-name prefix of the FIFOs in --fr-dir (default pipe_)")
    add("--fr-dump-prefix", default="fr_", metavar="PREFIX",
        help="TORCH_FR_DUMP_TEMP_FILE's prefix: a name in --fr-dir, or a path (default fr_)")
    pyspy = {"dest": "hang_pyspy", "default": None}  # None: on where py-spy is installed
    add("--hang-pyspy", action="store_true", **pyspy,
        help="when the log falls silent, take py-spy stacks of the job's processes on this "
        "node (driver and workers) and say where each is (default: on where py-spy is "
        "installed; needs ptrace rights)")
    add("--no-hang-pyspy", action="store_false", **pyspy,
        help="take no py-spy stacks (docs/hangs.md)")
    add("--hang-job-pid", type=int, metavar="PID", default=None,
        help="the job's root process on this node, when the exporter was started neither by "
        "`verl-monitor run` nor inside the job's Ray cluster: it and its descendants running "
        "as its user are the job's (py-spy reads only processes proven to be the job's)")


#: The collector of this exporter (the latest made), for :func:`job_tree_now` and
#: :func:`hang_state_now`.
_CURRENT: list[weakref.ref] = []


def job_tree_now() -> JobTree:
    """The job's proven processes on this node, as this exporter's collector last found them
    (empty, with why, before it looked or without a collector)."""
    c = _CURRENT[0]() if _CURRENT else None
    return c.job_tree() if c is not None else JobTree(why="the hang collector is not running")


def hang_state_now() -> HangState | None:
    """The current hang verdict of this exporter's collector: the driver's place, how long it
    has been held, how long it normally takes, and whether that is a hang (None before a
    steady reading, or without a collector)."""
    c = _CURRENT[0]() if _CURRENT else None
    return c.hang_state() if c is not None else None


def _cut(text: object) -> str:
    s = str(text)
    return s if len(s) <= MAX_LABEL else s[: MAX_LABEL - 1] + "…"


class FlightRecorderCollector(PollingView):
    """Requests dumps once per silence and publishes who holds the others."""

    thread_name = "flight-recorder"

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)
        opts = ctx.options
        self.fr_dir = opts.fr_dir
        self.pipe_prefix = opts.fr_pipe_prefix
        self.dump_prefix = opts.fr_dump_prefix
        #: py-spy: on unless ``--no-hang-pyspy`` (it is in the core install; where it cannot
        #: run, ``pyspy_problem`` says why and how to fix it)
        self.pyspy_exe = find_pyspy() if opts.hang_pyspy is not False else None
        self.pyspy = opts.hang_pyspy is not False and self.pyspy_exe is not None
        self.pyspy_problem: str | None = None if self.pyspy or opts.hang_pyspy is False else (
            f"py-spy is not installed, so a stuck job's process and line cannot be named: "
            f"{INSTALL_FIX}")
        self._said: set[str] = set()  # problems already logged (each once)
        #: each round's dumps are kept beside the run store for ``analyze --stacks``, in a
        #: folder written safely and trimmed like the store (monitor/hang/stack_files.py)
        self.stacks_dir = StackFolder(Path(f"{opts.store}.stacks")) \
            if getattr(opts, "store", None) else None
        # the monitor's copy of --config when it runs detectors: read once, one truth
        self.cfg = (ctx.config or load_config(opts.config)).section("hang")
        self._tree = JobTree()
        self._run_pid = run_parent()
        _CURRENT[:] = [weakref.ref(self)]
        self.sampler = HoldSampler(HoldLimits.from_config(self.cfg),
                                   self.cfg.get_float("sample_s", 10.0),
                                   self.cfg.get_float("restack_s", 30.0), ctx.node) \
            if self.pyspy and self.cfg.get_float("sample_s", 10.0) > 0 else None
        self._lock = threading.Lock()
        self._handled: float | None = None  # the silence (last step end) already handled
        self._dumps: dict[int, RankDump] = {}
        self._loc: Localization | None = None
        self._rounds: dict[tuple[str, str], int] = {}
        self._seconds = 0.0
        self._wait_episode: float | None = None  # start of the local GPUs' waiting, if any
        self._wait_checked = 0.0
        self._stacked: float | None = None  # the silence the stack rounds belong to
        self._stack_rounds = 0
        self._stacked_at = 0.0
        self._stuck = False
        self._stacks: StackRound | None = None
        self._watch = GoneWatch()
        self._watch_at = 0.0

    @property
    def enabled(self) -> bool:
        """True when a dump directory or py-spy was given (or py-spy was wanted and cannot
        run: that is said)."""
        return bool(self.fr_dir) or self.pyspy or self.pyspy_problem is not None

    def stop(self) -> None:
        """Stop the thread, then every py-spy still running (none outlives the exporter)."""
        super().stop()
        stop_all()

    def job_tree(self) -> JobTree:
        """The job's proven processes on this node (refreshed every ``WATCH_S`` seconds)."""
        return self._tree

    def hang_state(self) -> HangState | None:
        """The current hang verdict: the driver's place, how long it has been held, how long
        it normally takes (None before a steady reading)."""
        return self.sampler.state() if self.sampler is not None else None

    def silence(self) -> tuple[float | None, bool]:
        """(the last step's end, whether the silence since it exceeds the hang limit)."""
        window = self.ctx.window
        if window is None:
            return None, False
        steps = sorted((s for s in window.recent_steps(8) if s.end_time is not None),
                       key=lambda s: float(s.end_time))
        if not steps:
            return None, False
        last = float(steps[-1].end_time)
        recent = recent_step_time(steps)
        if not recent:
            return last, False
        lim = silence_limit(recent, between_step_allowance(steps), self.cfg)
        return last, time.time() - last > lim

    def waiting_start(self) -> float | None:
        """When this node's GPUs started waiting in a collective (``min_seconds`` at least).

        Nodes without the verl log see no steps: a local GPU spinning in a collective (the
        ``hang`` detector's waiting signature) for ``min_seconds`` is their trigger. Checked
        every ``WAIT_CHECK_S`` seconds on the newest GPU rows only.
        """
        window = self.ctx.window
        now = time.time()
        if window is None:
            return None
        if now - self._wait_checked < WAIT_CHECK_S:
            return self._wait_episode
        self._wait_checked = now
        span = self.cfg.get_float("min_seconds")
        rows = window.gpu_since(now - span)
        waiting = False
        if rows:
            df = pd.DataFrame(rows)
            if "sm_active" in df and float(df["ts"].min()) <= now - 0.8 * span:
                states = gpu_states(df, now - span, now, self.cfg)
                waiting = any(v == "waiting" for v in states.values())
        if not waiting:
            self._wait_episode = None
        elif self._wait_episode is None:
            self._wait_episode = now - span
        return self._wait_episode

    def _flag_start(self) -> float | None:
        tracker = self.ctx.tracker
        if tracker is None:
            return None
        starts = [f.start for f in tracker.active() if f.kind in ("hang", "stalled")]
        return min(starts) if starts else None

    def poll_once(self) -> None:
        """Steady readings of the driver; a round per silence; nothing else while steps come."""
        if not self.enabled:
            return
        self.watch_processes()
        self.sample()
        last_step, silent = self.silence()
        if self._stacked is not None and last_step is not None and \
                abs(self._stacked - last_step) > 1e-6:  # progress again: its stacks go
            self._stacked, self._stacks = None, None
        if last_step is not None and self._stack_due(last_step):
            self.run_stacks(last_step)
        flag = self._flag_start()
        waiting = self.waiting_start()
        if not (silent or flag is not None or waiting is not None):
            if self._handled is not None:  # progress again: the last round's series go
                self._handled = None
                with self._lock:
                    self._dumps, self._loc = {}, None
            return
        # one round per silence: the silence is named by the last step before it (nodes
        # without the log: by the flag, else by when their GPUs started waiting)
        mark = last_step if last_step is not None else (flag if flag is not None else waiting)
        if self._handled is not None and abs(self._handled - mark) < 1e-6:
            return
        self._handled = mark
        self.say_why_no_stacks()
        if self.fr_dir or self.pyspy:
            self.run_round()

    def watch_processes(self) -> None:
        """Every ``WATCH_S`` seconds, the job's proven processes with their GPU and rank (the
        Flight Recorder FIFO each reads); every poll, which of them went away."""
        now = time.time()
        if now - self._watch_at >= WATCH_S:
            self._watch_at = now
            self._tree = job_process_tree(tuple(self.ctx.options.log or ()), self._run_pid,
                                          getattr(self.ctx.options, "hang_job_pid", None))
            pipes = find_pipes(self.fr_dir, self.pipe_prefix) if self.fr_dir else {}
            procs = list(self._tree.procs)
            pmap = scan(list(pipes.values()), pids=self._tree.pids)
            self._watch.see(procs, now, {p.pid: g for p in procs
                                         if (g := pmap.gpu_of(p.pid)) is not None},
                            _ranks(pipes, pmap))
            self._check_ptrace(procs)
        self._watch.check(now)

    def _check_ptrace(self, procs: list[JobProcess]) -> None:
        """Once the job's processes are known: whether py-spy may attach to them here."""
        if not self.pyspy or not procs or self.pyspy_problem is not None:
            return
        info = proc_info(procs[0].pid)
        why = ptrace_problem(info.uid if info is not None else None)
        if why:
            self.pyspy_problem = why
            self._say(why)

    def _say(self, text: str | None) -> None:
        """Log ``text`` once (each problem once per exporter)."""
        if text and text not in self._said:
            self._said.add(text)
            log.warning("flight_recorder: %s", text)

    def say_why_no_stacks(self) -> None:
        """In a silence where py-spy cannot run (not installed, no ptrace rights): one
        ``hang_dump`` event that says so, with the fix, for the flags' evidence."""
        if self.pyspy_problem is None:
            return
        self._say(self.pyspy_problem)
        got = StackRound(problems={"py-spy": self.pyspy_problem})
        self._stacks = got
        self._count("py-spy", "unavailable")
        self.ctx.sink.add_events([got.to_event(time.time(), self.ctx.node)])

    def sample(self) -> None:
        """The steady reading of the job's driver, when due (``hang.sample_s``): a place held
        past its normal time is published as an over-event (monitor/hang/sampler.py)."""
        sampler = self.sampler
        if sampler is None or not self._tree.procs or self.pyspy_problem is not None:
            return
        now = time.time()
        if sampler.due(now) is None:
            return
        window = self.ctx.window
        if window is not None:
            sampler.add_steps(window.recent_steps(64))
        timeout = self.cfg.get_float("pyspy_timeout_s", 10.0)

        def take(procs: list[JobProcess], full: bool) -> StackRound:
            got = stack_round(procs, self.ctx.node, self.pyspy_exe, timeout, self.stacks_dir,
                              nonblocking=True)
            self._count("py-spy-steady", "ok" if got.wheres else "failed")
            self._note_refusal(got)
            return got

        sampler.keep_only(self._tree.pids)
        events = sampler.run(now, list(self._tree.procs), take)
        if events:
            self.ctx.sink.add_events(events)

    def _note_refusal(self, got: StackRound) -> None:
        """A py-spy refused for lack of ptrace rights: said once, and the steady readings
        stop (they would fail the same way)."""
        for why in got.problems.values():
            if "ptrace rights" in why and not got.wheres:
                self.pyspy_problem = why
                self._say(why)
                return

    def _stack_due(self, last: float) -> bool:
        """True when a py-spy round is due in the silence after ``last`` (the last step's end):
        first at ``stack_limit``, then every ``hang.restack_s`` while no round said stuck."""
        if not self.pyspy or self.pyspy_problem is not None:
            return False
        now = time.time()
        if self._stacked is None or abs(self._stacked - last) > 1e-6:
            window = self.ctx.window
            steps = sorted((s for s in window.recent_steps(8) if s.end_time is not None),
                           key=lambda s: float(s.end_time)) if window is not None else []
            recent = recent_step_time(steps)
            return bool(recent) and now - last > stack_limit(recent, self.cfg)
        return (not self._stuck and self._stack_rounds < MAX_STACK_ROUNDS
                and now - self._stacked_at >= self.cfg.get_float("restack_s", 30.0))

    def run_stacks(self, last: float | None = None) -> StackRound:
        """py-spy the job's local processes (driver and workers), judge where each is, and
        publish the ``hang_dump`` event; ``last`` names the silence it belongs to."""
        if last is not None and (self._stacked is None or abs(self._stacked - last) > 1e-6):
            self._stacked, self._stack_rounds, self._stuck = last, 0, False
        procs = list(self._tree.procs)
        self._watch.see(procs, time.time())
        since = self._stacked if self._stacked is not None else self._wait_episode
        gone = gone_wheres(self._watch.gone_since(since), since, self.ctx.node) \
            if since is not None else []
        got = stack_round(procs, self.ctx.node, self.pyspy_exe,
                          self.cfg.get_float("pyspy_timeout_s", 10.0), self.stacks_dir,
                          gone, since)
        if not procs and not got.gone:  # said once in the log too, in the first silence
            got.problems["py-spy"] = self._tree.why or "no process of the job is proven"
            self._say(got.problems["py-spy"])
        self._note_refusal(got)
        self._stack_rounds += 1
        self._stacked_at = time.time()
        self._stuck = bool(got.verdict and got.verdict.stuck)
        self._stacks = got
        self._count("py-spy", "ok" if got.wheres else "failed")
        self.last_error = "; ".join(f"{k}: {v}" for k, v in sorted(got.problems.items())
                                    )[:500] or None
        self.ctx.sink.add_events([got.to_event(time.time(), self.ctx.node)])
        return got

    def run_round(self) -> Localization:
        """One round: Flight Recorder, else py-spy; publishes the ``hang_dump`` event."""
        t0 = time.monotonic()
        problems: dict[str, str] = {}
        loc: Localization | None = None
        dumps: dict[int, RankDump] = {}
        infos: dict[int, RankInfo] = {}
        if self.fr_dir:
            pipes = find_pipes(self.fr_dir, self.pipe_prefix)
            pmap = scan(list(pipes.values()))
            for rank, pipe in pipes.items():
                pid = pmap.fifo_pids.get(os.path.realpath(pipe))
                infos[rank] = RankInfo(node=self.ctx.node, gpu=pmap.gpu_of(pid), pid=pid)
            got = request_dumps(self.fr_dir, self.pipe_prefix, self.dump_prefix,
                                wait_s=self.cfg.get_float("dump_wait_s", 20.0))
            dumps = got.dumps
            if got.note:
                problems["flight_recorder"] = got.note
            for rank, why in got.problems.items():
                problems[f"rank {rank}"] = why
            self._count("flight_recorder", got.result)  # ok, bad_dump (some ranks) or failed
            if dumps:
                loc = localize_dumps(dumps, got.problems, infos)
        if (loc is None or not loc.culprits) and self.pyspy:
            fresh = self._stacks is not None and time.time() - self._stacked_at < \
                self.cfg.get_float("restack_s", 30.0)
            if not fresh:
                self.run_stacks()
            if loc is None:
                loc = Localization(method="py-spy",
                                   note=self._stacks.verdict.summary() if self._stacks and
                                   self._stacks.verdict else "no stack could be read")
                return self._publish_fr(loc, dumps, problems, t0, event=False)
        if loc is None:
            loc = Localization(note="; ".join(problems.values()) or "nothing to ask")
        return self._publish_fr(loc, dumps, problems, t0)

    def _publish_fr(self, loc: Localization, dumps: dict[int, RankDump],
                    problems: dict[str, str], t0: float, event: bool = True) -> Localization:
        took = time.monotonic() - t0
        with self._lock:
            self._dumps, self._loc, self._seconds = dumps, loc, took
        if problems or event:
            self.last_error = "; ".join(f"{k}: {v}" for k, v in sorted(problems.items())
                                        )[:500] or self.last_error
        if event:  # a py-spy round published its own event already
            self.ctx.sink.add_events([loc.to_event(time.time(), self.ctx.node, took, problems)])
        return loc

    def _count(self, method: str, result: str) -> None:
        with self._lock:
            self._rounds[(method, result)] = self._rounds.get((method, result), 0) + 1

    def collect(self) -> Iterable[Metric]:
        """The last round's per-rank positions and culprits, and the round counters."""
        if not self.enabled:
            return []
        with self._lock:
            dumps, loc, rounds, took = dict(self._dumps), self._loc, dict(self._rounds), \
                self._seconds
        stacks = self._stacks
        seq = GaugeMetricFamily("verlmon_fr_collective_seq",
                                "Last collective sequence number per rank and process group in "
                                "the last Flight Recorder round (started is -1 when not tracked)",
                                labels=["rank", "pg", "state"])
        pend = GaugeMetricFamily("verlmon_fr_pending_info",
                                 "The oldest collective each rank has not completed (value 1)",
                                 labels=["rank", "pg", "collective", "state", "seq"])
        for rank, d in sorted(dumps.items()):
            for pg, g in sorted(d.groups.items()):
                for state, v in (("enqueued", g.enqueued), ("started", g.started),
                                 ("completed", g.completed)):
                    seq.add_metric([str(rank), _cut(pg), state], float(v))
                if g.pending:
                    p = g.pending[0]
                    pend.add_metric([str(rank), _cut(pg), _cut(p.name), p.state, str(p.seq)], 1.0)
        who = GaugeMetricFamily("verlmon_hang_culprit_info",
                                "The rank(s) the last round named as holding the others (value 1)",
                                labels=["rank", "pid", "gpu", "collective", "seq", "frame"])
        for c in (loc.culprits if loc else []):
            who.add_metric(["" if c.rank < 0 else str(c.rank), str(c.pid or ""), "" if c.gpu is None else str(c.gpu),
                            _cut(c.collective), "" if c.seq is None else str(c.seq),
                            _cut(c.frame or "")], 1.0)
        verdict = stacks.verdict if stacks is not None else None
        for w in (verdict.who if verdict is not None and verdict.stuck else []):
            who.add_metric(["" if w.rank is None else str(w.rank), str(w.pid or ""),
                            "" if w.gpu is None else str(w.gpu), "", "",
                            _cut(w.frame or "")], 1.0)
        where = GaugeMetricFamily("verlmon_hang_where_info",
                                  "Where each local process of the job was in the last py-spy "
                                  "round of a silence (value 1: the process named as stuck)",
                                  labels=["role", "pid", "place", "phase", "frame", "detail"])
        for w in (verdict.who + verdict.others if verdict is not None else []):
            where.add_metric([w.role, str(w.pid or ""), w.place, w.phase, _cut(w.frame or ""),
                              _cut(w.detail)],
                             1.0 if verdict.stuck and w in verdict.who else 0.0)
        rounds_f = CounterMetricFamily("verlmon_hang_dump_rounds",
                                       "Dump rounds taken when the job went silent, by method "
                                       "and result", labels=["method", "result"])
        for (method, result), n in sorted(rounds.items()):
            rounds_f.add_metric([method, result], float(n))
        secs = GaugeMetricFamily("verlmon_hang_dump_seconds",
                                 "Seconds the last dump round took (request to answer)")
        secs.add_metric([], took)
        return [seq, pend, who, where, rounds_f, secs, *self._readiness(), *self._holds()]

    def _readiness(self) -> list[Metric]:
        """Whether py-spy can read the job here (and why not, with the fix), and how many
        processes are proven the job's."""
        ready = GaugeMetricFamily(m.HANG_PYSPY_READY,
                                  "1 when py-spy can read the job's processes on this node, 0 "
                                  "when it cannot (verlmon_hang_pyspy_problem_info says why)")
        ready.add_metric([], 1.0 if self.pyspy and self.pyspy_problem is None else 0.0)
        problem = GaugeMetricFamily(m.HANG_PYSPY_PROBLEM_INFO,
                                    "Why py-spy cannot read the job here, with the fix (value 1)",
                                    labels=["problem"])
        if self.pyspy_problem:
            problem.add_metric([_cut(self.pyspy_problem)], 1.0)
        procs = GaugeMetricFamily(m.HANG_JOB_PROCESSES,
                                  "Processes proven to be the job's on this node (the only ones "
                                  "py-spy reads)")
        procs.add_metric([], float(len(self._tree.procs)))
        return [ready, problem, procs]

    def _holds(self) -> list[Metric]:
        """Each driver's current place: how long it has been held, how long it normally
        takes, and its limit (from the steady readings)."""
        labels = ["role", "pid", "place", "phase", "frame"]
        held = GaugeMetricFamily(m.HANG_HELD_SECONDS,
                                 "Seconds the driver has been at its current place (steady "
                                 "py-spy readings)", labels=labels)
        normal = GaugeMetricFamily(m.HANG_HELD_NORMAL_SECONDS,
                                   "Seconds that place normally takes in this run (its phase's "
                                   "longest step timer, or its longest earlier hold)",
                                   labels=labels)
        limit = GaugeMetricFamily(m.HANG_HELD_LIMIT_SECONDS,
                                  "Seconds after which holding that place is a hang (absent: "
                                  "never, a long phase seen for the first time)", labels=labels)
        sampler = self.sampler
        for pid, a in sorted(list((sampler.assessments if sampler else {}).items()),
                             key=lambda kv: kv[0] or 0):
            h = sampler.tracker.holds.get(pid)
            row = [h.role if h else "", str(pid or ""), a.place, a.phase,
                   _cut(h.frame if h else "")]
            held.add_metric(row, a.held_s)
            normal.add_metric(row, a.normal_s)
            if a.limit_s != float("inf"):
                limit.add_metric(row, a.limit_s)
        return [held, normal, limit]


def _ranks(pipes: dict[int, object], pmap: ProcessMap) -> dict[int, int]:
    """PID -> rank, from which process reads each rank's debug-info FIFO."""
    out = {}
    for rank, pipe in pipes.items():
        pid = pmap.fifo_pids.get(os.path.realpath(str(pipe)))
        if pid is not None:
            out[pid] = rank
    return out
