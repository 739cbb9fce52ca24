"""What the exporter does on a confirmed hang: ``--on-hang alert|dump|terminate``.

- ``alert`` (the default): nothing more than the ``hang`` flag itself (store, Slack, wandb).
- ``dump``: once a critical ``hang`` flag opens, the evidence goes into the store as one
  ``hang_evidence`` event: py-spy stacks of the job's processes on this node (every thread),
  what the ranks' Flight Recorder dumps in ``--fr-dir`` say, and the last lines of the log.
- ``terminate``: ``dump``, then stack rounds every ``--on-hang-restack`` seconds while the flag
  holds, and the job's process tree ended (SIGTERM, SIGKILL after ``--on-hang-grace``) once
  every guard of ``monitor.hang.terminate.decide`` holds (the hang held
  ``--on-hang-after``, default 10 min; the same place in every round; not a phase the job's own
  history shows lasting that long; the tree known: the exporter of ``verl-monitor run``). The
  scheduler's retry (Slurm ``--requeue``, Ray job retries, a restart policy) then resumes the
  job from its last checkpoint.

What it did, or why it did not once the hold had passed, goes to the store (a
``hang_action`` event, which the attempt ledger reads as the attempt's end), to Slack and to
the exporter's log, in the same words; ``verlmon_hang_actions_total{action, result}`` counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from monitor import metric_names as m
from monitor.hang.terminate import (
    DEFAULT_AFTER_S,
    DEFAULT_GRACE_S,
    DEFAULT_RESTACK_S,
    Decision,
    HangPolicy,
    decide,
    end_tree,
    is_stack_round,
    job_root,
)
from monitor.live.live_view import FlagGroup, PollingView, ViewContext
from monitor.records import Event, Flag, StepRecord

log = logging.getLogger("verl_monitor.exporter")

MODES = ("alert", "dump", "terminate")
#: Evidence kept at most: bytes of one process's stacks, processes, bytes of the log's end.
STACK_BYTES, MAX_STACKS, LOG_TAIL_BYTES = 32_768, 16, 16_384


def add_flags(group: FlagGroup) -> None:
    """``--on-hang`` and its settings."""
    add = group.add_argument
    add("--on-hang", choices=MODES, default=None,
        help="on a critical hang: alert (default: the flag only), dump (also saves stacks, "
        "Flight Recorder dumps and the log's last lines into the store) or terminate (also "
        "ends the job's process tree under verl-monitor run once every guard holds; "
        "docs/attempts.md)")
    add("--on-hang-after", type=float, default=None, metavar="SECONDS",
        help=f"terminate: the hang must have held this long (default {DEFAULT_AFTER_S:g})")
    add("--on-hang-grace", type=float, default=None, metavar="SECONDS",
        help=f"terminate: SIGKILL what SIGTERM left after this long (default "
        f"{DEFAULT_GRACE_S:g})")
    add("--on-hang-restack", type=float, default=None, metavar="SECONDS",
        help=f"terminate: a py-spy round this often while the hang holds (default "
        f"{DEFAULT_RESTACK_S:g})")


def action_message(title: str, text: str, run: str | None = None) -> dict:
    """The Slack payload: a header and the words (escaped: never a mention or a link)."""
    from monitor.notify.slack import slack_escape

    head = title + (f" - {run}" if run else "")
    return {"text": slack_escape(f"{head}: {text}"),
            "blocks": [{"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
                       {"type": "section", "text": {"type": "mrkdwn",
                                                    "text": slack_escape(text[:2900])}}],
            "meta": {"kind": "hang_action"}}


class HangActionView(PollingView):
    """Watches the tracker for a critical hang and acts as ``--on-hang`` says."""

    thread_name = "hang-action"

    def __init__(self, ctx: ViewContext) -> None:
        super().__init__(ctx)
        opts = ctx.options
        self.mode = getattr(opts, "on_hang", "alert") or "alert"
        self.policy = HangPolicy(
            after_s=float(getattr(opts, "on_hang_after", None) or DEFAULT_AFTER_S),
            restack_s=float(getattr(opts, "on_hang_restack", None) or DEFAULT_RESTACK_S),
            grace_s=float(getattr(opts, "on_hang_grace", None) or DEFAULT_GRACE_S))
        from monitor.hang.pyspy import find_pyspy

        self.pyspy_exe = find_pyspy()
        self.counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._episode: float | None = None
        self._rounds: list[Event] = []
        self._round_at = 0.0
        self._said: set[str] = set()
        self._done = False
        self._history: list[StepRecord] | None = None
        #: the tree's root and why not: ``monitor.hang.terminate.job_root`` (tests re-point it)
        self.find_root = job_root
        #: the job's processes on this node, for stacks (tests re-point it)
        self.find_procs = self._procs

    # ------------------------------------------------------------------ the loop
    def poll_once(self) -> None:
        """One look at the open flags."""
        self.poll(time.time())

    def poll(self, now: float) -> Decision | None:
        """Act on the open critical hang, if any; the decision taken (None: nothing to do)."""
        if self.mode == "alert":
            return None
        flag = self._open_hang()
        if flag is None:
            self._episode = None
            return None
        if self._episode is None or abs(self._episode - float(flag.start)) > 1e-6:
            self._episode, self._rounds, self._said, self._done = float(flag.start), [], set(), \
                False
            self._history = None
            self.save_evidence(flag, now)
        if self.mode != "terminate" or self._done:
            return None
        if now - self._round_at >= self.policy.restack_s:
            self._round_at = now
            self._take_round()
            # judged at the clock after the round: py-spy (and the evidence before it) take
            # seconds on a loaded node
            now = max(now, time.time())
        return self._judge(flag, now)

    def _open_hang(self) -> Flag | None:
        tracker = self.ctx.tracker
        found = [f for f in (tracker.active() if tracker is not None else [])
                 if f.kind == "hang" and f.severity == "critical" and f.end is None]
        return min(found, key=lambda f: f.start) if found else None

    def _judge(self, flag: Flag, now: float) -> Decision:
        window = self.ctx.window
        seen = [e for e in (window.frames()[3] if window is not None else [])
                if is_stack_round(e)]
        root, why = self.find_root()
        if self.pyspy_exe is None:
            d = Decision(False, "py-spy is not installed: the place cannot be confirmed in "
                         "stack rounds", held_s=now - float(flag.start), guard="stacks")
            if d.held_s < self.policy.after_s:
                return d
        else:
            d = decide(flag, seen + self._rounds, self._steps(), now, self.policy,
                       tree=why or None)
        if d.act and root is not None:
            self._terminate(flag, d, root, now)
        elif d.guard not in ("flag", "hold") and d.guard not in self._said:
            self._said.add(d.guard)
            self._report(flag, now, False, f"The hang has held {d.held_s:.0f} s; the job is "
                         f"not ended: {d.why}.", d, {})
        return d

    # ------------------------------------------------------------------ the pieces
    def _procs(self) -> list:
        from monitor.hang.procs import job_process_tree, run_parent

        return list(job_process_tree(tuple(self.ctx.options.log or ()), run_parent(),
                                     getattr(self.ctx.options, "hang_job_pid", None)).procs)

    def _take_round(self) -> None:
        """One py-spy round of the job's processes, kept for the guards (not published: the
        hang detector reads its own), timed when py-spy started on them."""
        if self.pyspy_exe is None:
            return
        from monitor.hang.stacks import stack_round

        began = time.time()
        got = stack_round(self.find_procs(), self.ctx.node, self.pyspy_exe, 10.0)
        self._rounds.append(got.to_event(began, self.ctx.node))
        self._rounds = self._rounds[-200:]

    def _steps(self) -> list[StepRecord]:
        """The job's history: the run store's steps (read once a hang), else the window's."""
        if self._history is None:
            store = getattr(self.ctx.options, "store", None)
            self._history = []
            if store:
                try:
                    from monitor.store import RunStore

                    self._history = RunStore(store, create=False).steps()
                except Exception as exc:  # noqa: BLE001 - the window's steps then
                    log.warning("hang action: the store's steps cannot be read (%s)", exc)
        window = self.ctx.window
        return self._history + (window.frames()[0] if window is not None else [])

    def _terminate(self, flag: Flag, d: Decision, root: int, now: float) -> None:
        self._done = True
        ended = end_tree(root, self.policy.grace_s)
        words = (f"Terminated the hung job: {ended.words()}. Why: {d.why}. The scheduler's "
                 "retry resumes it from its last checkpoint (trainer.resume_mode=auto).")
        self._report(flag, now, True, words, d, {"root": root, "terminated": ended.terminated,
                                                 "killed": ended.killed,
                                                 "failed": {str(k): v for k, v in
                                                            ended.failed.items()}})

    def _report(self, flag: Flag, now: float, acted: bool, words: str, d: Decision,
                extra: dict) -> None:
        """The same words to the store (``hang_action``), Slack and the log."""
        data = {"action": "terminate", "acted": acted, "flag_start": float(flag.start),
                "node": self.ctx.node, **d.to_dict(), **extra,
                "rounds_seen": [[round(float(e.time), 3), str(e.message)[:300]]
                                for e in self._rounds[-10:]]}
        self.ctx.sink.add_events([Event("hang_action", now, None, words, data)])
        self._count("terminate", "acted" if acted else "refused")
        (log.warning if acted else log.info)("on-hang terminate: %s", words)
        notifier = self.ctx.notifier
        if notifier is not None:
            title = "Hang: job terminated" if acted else "Hang: job not terminated"
            notifier.notify_digest(action_message(title, words, getattr(notifier, "run", None)),
                                   f"hang_action|{self.ctx.node}|{flag.start}|{d.guard}")

    def save_evidence(self, flag: Flag, now: float) -> Event:
        """``dump``: the stacks, Flight Recorder summary and log tail as one ``hang_evidence``
        event in the store (published through the sink)."""
        stacks, problems = self._stack_texts()
        data = {"flag_start": float(flag.start), "node": self.ctx.node, "stacks": stacks,
                "problems": problems, "flight_recorder": self._fr_summary(),
                "log_tail": self._log_tail()}
        fr = "a Flight Recorder summary" if data["flight_recorder"] else "no Flight Recorder"
        words = (f"Hang evidence saved: stacks of {len(stacks)} process(es), {fr}, the log's "
                 f"last {len(data['log_tail'])} line(s)")
        event = Event("hang_evidence", now, None, words, data)
        self.ctx.sink.add_events([event])
        self._count("dump", "saved")
        log.info("on-hang %s: %s", self.mode, words)
        return event

    def _stack_texts(self) -> tuple[dict[str, str], dict[str, str]]:
        if self.pyspy_exe is None:
            return {}, {"py-spy": "not installed"}
        from monitor.hang.pyspy import dump_text

        out, problems = {}, {}
        for p in self.find_procs()[:MAX_STACKS]:
            text, why = dump_text(p.pid, 10.0, self.pyspy_exe)
            if why:
                problems[str(p.pid)] = why
            else:
                out[f"{p.role} {p.pid}"] = text[-STACK_BYTES:]
        return out, problems

    def _fr_summary(self) -> str:
        fr_dir = getattr(self.ctx.options, "fr_dir", None)
        if not fr_dir:
            return ""
        try:
            from monitor.hang.dump import read_dump_dir
            from monitor.hang.localize import localize_dumps

            dumps, unreadable = read_dump_dir(fr_dir)
            return localize_dumps(dumps, {r: why for r, why in unreadable.items()}).summary() \
                if dumps or unreadable else ""
        except (OSError, ValueError) as exc:
            return f"the Flight Recorder dumps cannot be read ({exc})"

    def _log_tail(self) -> list[str]:
        from monitor.hang.procs import read_tail

        lines: list[str] = []
        for path in self.ctx.options.log or ():
            lines += read_tail(path, LOG_TAIL_BYTES).splitlines()[1:]
        return lines[-200:]

    def _count(self, action: str, result: str) -> None:
        with self._lock:
            self.counts[(action, result)] = self.counts.get((action, result), 0) + 1

    def collect(self) -> Iterable[Metric]:
        """``verlmon_hang_actions_total{action, result}``."""
        fam = CounterMetricFamily(m.HANG_ACTIONS.removesuffix("_total"),
                                  "What --on-hang did: evidence saved (dump), the job ended "
                                  "(terminate, acted) or not (refused, with why in the store).",
                                  labels=["action", "result"])
        with self._lock:
            counts = dict(self.counts)
        for action, result in (("dump", "saved"), ("terminate", "acted"),
                               ("terminate", "refused")):
            counts.setdefault((action, result), 0)
        for (action, result), n in sorted(counts.items()):
            fam.add_metric([action, result], n)
        yield fam
