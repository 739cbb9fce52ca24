"""``verl-monitor analyze LOG [--gpu GPU.csv] [--host HOST.csv] [--events EVENTS.json]
[--log-end T] [--config F] [--json]``

Reads a finished (or running) verl log, console or file-logger JSONL, plus optional GPU/host
telemetry recordings, and prints where the step time goes, how busy the GPUs were per phase,
and the detectors' flags with advice. ``--json`` prints the same as one JSON object.
A missing or unreadable input file is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from cli.commands.simulate import _positive_int  # a whole number, 1 or more
from cli.errors import CommandError, exits, fail_if, warn
from monitor.analysis.summary import json_safe, summarize
from monitor.frames import (
    FrameError,
    empty_gpu_frame,
    empty_host_frame,
    read_gpu_frame,
    read_host_frame,
    read_nccl_frame,
    read_rollout_frame,
)
from monitor.logs.timestamps import log_timezone_arg
from monitor.records import Event

PROG = "verl-monitor analyze"


def parse_time(text: str) -> float:
    """Unix seconds from ``"1732867200"``/``"1732867200.5"`` or ISO 8601 (naive = UTC).

    Raises ValueError with a readable message.
    """
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value):
            raise ValueError(f"not a time: {text!r}")
        return value
    from monitor.logs.timestamps import parse_timestamp

    parsed = parse_timestamp(text.strip())
    if parsed is None:
        raise ValueError(
            f"not a time: {text!r} (give unix seconds or ISO 8601, e.g. 2026-11-29T08:30:00Z)"
        )
    return parsed


def _log_end(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


#: How ``verl-monitor analyze`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "analyze a verl log (and GPU/host recordings): phases, balance, flags, advice",
    "description": ("Read a verl console log or file-logger JSONL (the format is detected), "
        "optionally with GPU and host telemetry recorded by the exporter or `verl-monitor "
        "export`, and report step time per phase, throughput, weight-sync time, rollout long "
        "tail, data-parallel imbalance, events, GPU activity per phase and the detectors' "
        "flags with advice."),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``verl-monitor analyze``."""
    p.add_argument("log", metavar="LOG", help="verl console log or file-logger .jsonl")
    p.add_argument("more_logs", metavar="LOG", nargs="*", default=[],
                   help="more logs of the same job, its later attempts in order (each log is "
                   "an attempt unless verl-monitor run's <log>.attempts says more)")
    p.add_argument("--gpu", metavar="GPU.csv", help="GPU samples (CSV or Parquet, interchange "
                   "format); enables per-phase GPU attribution and GPU detectors")
    p.add_argument("--host", metavar="HOST.csv", help="host samples (CSV or Parquet); enables "
                   "the IO/CPU starvation detector")
    p.add_argument("--events", metavar="EVENTS.json", help="events written by `verl-monitor "
                   "export` (events.json), added to those found in LOG: OOMs and resumes a "
                   "train.jsonl cannot carry")
    p.add_argument("--nccl", metavar="NCCL.csv", help="NCCL Inspector records written by "
                   "`verl-monitor export` (nccl.csv); measures each step's time in collectives "
                   "for the communication detector")
    p.add_argument("--rollout", metavar="ROLLOUT.csv", help="rollout-engine samples written by "
                   "`verl-monitor export` or `simulate` (vLLM / SGLang servers: KV cache, "
                   "requests, preemptions); enables kv_cache_preemption and generation_tail and "
                   "the ledger's preempted work")
    p.add_argument("--log-timezone", type=log_timezone_arg, metavar="ZONE", default=None,
                   help="time zone of log timestamps without an offset (Python logging's "
                   "default %%(asctime)s): local (the host's, the default), UTC, +05:30 or a "
                   "name such as America/New_York")
    p.add_argument("--log-end", metavar="TIME", type=_log_end, default=None,
                   help="when the log's last step ended (unix seconds or ISO 8601, naive = the "
                   "host's zone); "
                   "used to rebuild step times of logs without timestamps (default: the file's "
                   "modification time)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="YAML file overriding detector thresholds (default: built-in thresholds)")
    p.add_argument("--wandb", metavar="PROJECT[/RUN_ID]", default=None,
                   help="also log the per-step phase times, per-phase GPU activity and the flags "
                   "to this wandb run (resumed by id, or created in PROJECT); offline files when "
                   "there is no network or API key")
    p.add_argument("--gpu-hour-cost", metavar="PRICE", type=_gpu_hour_cost, default=None,
                   help="price of one GPU-hour (any currency): the 'Where the GPU time went' "
                   "section then shows what the run and each cause of loss cost")
    p.add_argument("--trainer-gpus", metavar="N", type=_positive_int, default=None,
                   help="GPUs of the trainer pool (default: those in --gpu); with "
                   "--rollout-gpus the per-pool ledger adds up to the whole job")
    p.add_argument("--rollout-gpus", metavar="N", type=_positive_int, default=None,
                   help="GPUs of the rollout pool of a fully-async, separate-async or "
                   "one-step-off run (rollout.nnodes x rollout.n_gpus_per_node)")
    p.add_argument("--fr-dir", metavar="DIR", default=None,
                   help="PyTorch Flight Recorder dumps of the job's ranks (fr_<rank> files, "
                   "searched recursively: copy every node's into one folder); names the rank "
                   "the others wait for when the run hangs (docs/hangs.md)")
    p.add_argument("--stacks", metavar="DIR", default=None,
                   help="py-spy dumps the exporter saved in a silence (<store>.stacks: files "
                   "<unix_ts>_<role>_<pid>.txt): says where each process was stuck "
                   "(docs/hangs.md)")
    p.add_argument("--mtbf-hours", metavar="HOURS", type=_positive_float, default=None,
                   help="the mean time between failures to plan checkpoints with, instead of "
                   "the failures seen over the job's attempts")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (steps, events, summary, flags) instead of text")
    p.add_argument("--fail-on", choices=("warning", "critical"), default=None,
                   help="for CI jobs: exit 1 when the run raised a flag this severe or worse "
                   "(the report is printed all the same; default: exit 0 whatever the flags)")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return value


def _gpu_hour_cost(text: str) -> float:
    """``--gpu-hour-cost``: a finite number, zero or more."""
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


_SQLITE_MAGIC = b"SQLite format 3\x00"
#: Bytes of LOG read to tell a text log from a binary file.
_SNIFF_BYTES = 65536


def _head(path: str, what: str) -> bytes | str:
    """The first bytes of ``path``, or the one-line reason it cannot be read (a str)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(_SNIFF_BYTES)
    except IsADirectoryError:
        return f"{path}: is a directory, not {what}"
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror or exc})"


def log_file_problem(path: str) -> str | None:
    """None when ``path`` looks like a text log, else the one-line reason: a run store (SQLite,
    which ``verl-monitor export`` turns into files ``analyze`` reads), or a binary file."""
    head = _head(path, "a log file")
    if isinstance(head, str):
        return head
    if head.startswith(_SQLITE_MAGIC):
        return (f"{path}: is a SQLite database (a run store?), not a verl log; run "
                f"`verl-monitor export {path} --out DIR`, then `verl-monitor analyze "
                f"DIR/train.jsonl --gpu DIR/gpu.csv --host DIR/host.csv --events DIR/events.json`")
    if b"\x00" in head:
        return f"{path}: is a binary file, not a verl log (console output or file-logger JSONL)"
    text = head.decode("utf-8", errors="replace")
    if len(head) == _SNIFF_BYTES:  # a character cut at the end of the sample is not an error
        text = text[:-1]
    bad = text.count("\ufffd")
    if bad and bad > 0.01 * len(text):
        return f"{path}: is not text (UTF-8), not a verl log (console output or file-logger JSONL)"
    return None


def _data_end(steps: list, gpu: pd.DataFrame, host: pd.DataFrame) -> float | None:
    """The newest time in the inputs: 'now' for detectors looking at a finished recording."""
    candidates = [s.end_time for s in steps if s.end_time is not None]
    for df in (gpu, host):
        if len(df):
            candidates.append(float(df["ts"].max()))
    return max(candidates) if candidates else None


class EventsFileError(ValueError):
    """An events.json that cannot be used; one line naming the file."""


class NoVerlLines(ValueError):
    """A LOG in which nothing reads as verl's: no step line, no event (one line to say so)."""


def read_events(path: str) -> list[Event]:
    """Events from a JSON list of ``Event.to_dict()`` objects (``export``'s events.json)."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise EventsFileError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise EventsFileError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(raw, list):
        raise EventsFileError(f"{path}: expected a JSON list of events")
    out = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise EventsFileError(f"{path}: item {n} is not an event (needs a 'kind')")
        t = item.get("time")
        out.append(Event(kind=item["kind"], time=float(t) if isinstance(t, (int, float)) else None,
                         step=item.get("step") if isinstance(item.get("step"), int) else None,
                         message=str(item.get("message") or ""),
                         data=item.get("data") if isinstance(item.get("data"), dict) else {}))
    return out


def merge_events(a: list[Event], b: list[Event]) -> list[Event]:
    """Both lists, identical events once, in time order (events without a time last)."""
    seen, out = set(), []
    for e in [*a, *b]:
        key = (e.kind, e.time, e.step, e.message)
        if key in seen:
            continue
        seen.add(key)
        out.append(e)
    return sorted(out, key=lambda e: (e.time is None, e.time or 0.0))


def attribute_rows(steps: list, gpu: pd.DataFrame) -> pd.DataFrame:
    """Per step, phase and GPU activity, for the wandb sink."""
    from monitor.analysis.attribution import attribute

    return attribute(steps, gpu)


def log_to_wandb(target: str, steps: list, flags: list, attribution: Any,
                 gpu: Any = None, config: Any = None,
                 job_config: dict[str, Any] | None = None,
                 attempts: dict[str, Any] | None = None) -> None:
    """Send the analysis to wandb (with per-step goodput shares when ``gpu`` samples are
    given, under ``config`` and the job's printed ``job_config``: the report's own; the
    ledger across the job's ``attempts``); any failure is one line on stderr, never fatal."""
    try:
        from monitor.integrations.wandb_sink import WandbSink

        with WandbSink.from_target(target, config=config, job_config=job_config) as sink:
            sink.log_analysis(steps, flags, attribution, gpu)
            if attempts is not None:
                sink.log_attempts(attempts)
    except Exception as exc:  # noqa: BLE001 - the report must still print
        warn("analyze", f"--wandb {target}: not logged ({exc})")


def _is_pyspy_round(event: Event) -> bool:
    """Whether ``event`` is a py-spy round the exporter recorded (``hang_dump``, py-spy)."""
    return event.kind == "hang_dump" and (event.data or {}).get("method") == "py-spy"


def _hang_evidence(args: argparse.Namespace, events: list[Event],
                   data_end: float | None) -> tuple[list[Event], dict[str, Any] | None]:
    """``--fr-dir`` and ``--stacks``: the events merged with what the Flight Recorder dumps
    and the py-spy stacks say, and the document's ``hang`` part (None without either)."""
    hang = None
    if getattr(args, "fr_dir", None):
        from monitor.hang.dump import read_dump_dir
        from monitor.hang.localize import localize_dumps

        dumps, unreadable = read_dump_dir(args.fr_dir)
        if not dumps and not unreadable:
            raise EventsFileError(f"--fr-dir {args.fr_dir}: no fr_<rank> dump in it")
        loc = localize_dumps(dumps, {r: f"its dump cannot be read: {why}"
                                     for r, why in unreadable.items()})
        event = loc.to_event(data_end,
                             problems={f"rank {r}": why for r, why in unreadable.items()})
        events = merge_events(events, [event])
        hang = {"ranks": sorted(dumps), "summary": loc.summary(), **event.data}
    if getattr(args, "stacks", None):
        from monitor.hang.stacks import stacks_report

        recorded = [e for e in events if _is_pyspy_round(e)]
        nodes = {str((e.data or {}).get("node") or "") for e in recorded}
        try:  # the dumps were taken where the recorded rounds were, when that was one node
            where, stack_events = stacks_report(args.stacks,
                                                nodes.pop() if len(nodes) == 1 else "")
        except ValueError as exc:
            raise EventsFileError(f"--stacks {exc}") from None
        # the saved rounds are judged again here: they replace the py-spy rounds the exporter
        # recorded from the same dumps, so the hang's evidence names each place once
        events = merge_events([e for e in events if e not in recorded], stack_events)
        hang = {**(hang or {"ranks": [], "summary": ""}), "stacks": where}
    return events, hang


#: The fields of each step in the ``--json`` document, in order.
_STEP_KEYS = ("step", "end_time", "total", "phases", "metrics", "throughput", "time_source",
              "source")


def build_document(args: argparse.Namespace) -> dict[str, Any]:
    """Parse and analyze; returns the ``--json`` document. Raises the readers' errors."""
    from monitor.logs.canonical_records import parse_file

    gpu = read_gpu_frame(args.gpu) if args.gpu else empty_gpu_frame()
    host = read_host_frame(args.host) if args.host else empty_host_frame()
    nccl = read_nccl_frame(args.nccl) if getattr(args, "nccl", None) else None
    rollout = read_rollout_frame(args.rollout) if getattr(args, "rollout", None) else None
    from monitor.config import load_config

    config = load_config(args.config)
    from monitor.logs.timestamps import set_log_timezone

    set_log_timezone(getattr(args, "log_timezone", None))
    parsed = parse_file(args.log, log_end=args.log_end)
    from monitor.logs.job_config import read_job_config_file, scan_head

    head = scan_head(args.log)  # the config verl printed at the start, read once
    if not (parsed.steps or parsed.events or parsed.actors or head.config is not None):
        raise NoVerlLines(
            f"{args.log}: no verl line in it ({parsed.stats.lines} line"
            f"{'' if parsed.stats.lines == 1 else 's'} read, none a step line "
            "such as 'step:1 - timing_s/step:...', no verl event, no Ray actor's line and no "
            "printed config): is it the training log?")
    telemetry, gpu, host = _align(args, parsed, gpu, host)
    use_gpu = use_gpu_frame(args, telemetry)
    more = list(getattr(args, "more_logs", None) or [])
    steps, events = _join(args.log, parsed, more)
    if getattr(args, "events", None):
        from monitor.analysis.attempt_logs import prefer_run_marks

        events = prefer_run_marks(merge_events(events, read_events(args.events)))

    events, hang = _hang_evidence(args, events, _data_end(steps, gpu, host))

    from monitor.analysis.run_analysis import RunAnalysis, json_top

    job_config = head.config
    job_config = job_config or next(filter(None, map(read_job_config_file, more)), None)
    ra = RunAnalysis(steps, gpu if use_gpu else None, host=host,
                     events=events, nccl=nccl,
                     rollout=rollout, config=config, now=_data_end(steps, gpu, host),
                     job_config=job_config, actors=parsed.actors)
    flags = ra.flags()
    from monitor.detect.flag_advice import tell_job_config  # issue 28 item 9: the printed config

    tell_job_config(flags, job_config)
    attribution = ra.phase_summary().to_dict("records") if use_gpu else None
    ledger, cad = _attempts(args, steps, events, flags, job_config)
    if getattr(args, "wandb", None):
        log_to_wandb(args.wandb, steps, flags, ra.attribution() if use_gpu else None,
                     gpu if use_gpu else None, config=config, job_config=job_config,
                     attempts=ledger)
    stats = parsed.stats
    gp_doc = ra.goodput(getattr(args, "gpu_hour_cost", None))
    pools = ra.pools(gp_doc, trainer_gpus=getattr(args, "trainer_gpus", None),
                     rollout_gpus=getattr(args, "rollout_gpus", None))
    return json_safe(
        {
            "log": str(args.log),
            "logs": [str(args.log), *(str(p) for p in more)],
            "format": parsed.format,
            "version_guess": parsed.version_guess,
            "clock": parsed.clock,
            "job_config": head.describe(),
            "telemetry": telemetry,
            "trainer_mode": pools["mode"],
            "trainer_mode_source": ra.mode.source,
            "parse": {
                "lines": stats.lines,
                "records": stats.records,
                "events": stats.events,
                "parse_errors": stats.parse_errors,
                "error_samples": list(stats.error_samples),
                "side_files": list(parsed.side_files),
            },
            "steps": [{key: getattr(s, key) for key in _STEP_KEYS} for s in steps],
            "events": [e.to_dict() for e in events],
            "summary": summarize(steps, events, None if more else parsed.run_start),
            "attribution": attribution,
            "goodput": gp_doc,
            "pools": pools,
            "flags": [f.to_dict() for f in flags],
            "premises": ra.premises(),
            "flag_costs": [json_top(c) for c in ra.flag_costs()],
            "top_problem": json_top(ra.top_problem()),
            "headline": _headline(args.log, steps, events, flags, gp_doc, config).to_json(),
            "hang": hang,
            "attempts": ledger,
            "cadence": cad,
        }
    )


def use_gpu_frame(args: argparse.Namespace, telemetry: dict[str, Any]) -> bool:
    """Whether the GPU samples take part: given, and in the log's time."""
    return bool(args.gpu) and telemetry.get("aligned") is not False


def _align(args: argparse.Namespace, parsed: Any, gpu: pd.DataFrame, host: pd.DataFrame
           ) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """The samples in the log's time: a log that dates its steps needs nothing; one without a
    clock is placed by the steps the store recorded beside the samples (``train.jsonl`` from
    ``verl-monitor export``), else the samples are left out, saying why."""
    from monitor.logs import align

    if not len(gpu) and not len(host):
        return {}, gpu, host
    bounded = any(s.time_source == "tqdm_after" for s in parsed.steps)
    if parsed.clock != "relative" and not bounded:
        return {"aligned": True, "by": "the log's own clock"}, gpu, host
    beside = align.store_steps_beside(args.gpu or args.host)
    offset = None
    if beside is not None and beside.resolve() != Path(args.log).resolve():
        from monitor.logs.canonical_records import parse_file

        offset = align.offset_by_steps(parsed.steps, parse_file(beside).steps)
    if offset is None:
        clock = ("places its steps only at or after the dated line before its progress bar"
                 if bounded else "has no clock (no timestamp, dated line or .arrivals file)")
        why = (f"the log {clock} and shares no step with the samples (the train.jsonl that "
               "`verl-monitor export` writes beside gpu.csv places it; or keep the log's "
               ".arrivals file beside it), so no GPU number is computed")
        return {"aligned": False, "why": why}, gpu.iloc[0:0], host.iloc[0:0]
    align.shift(parsed.steps, parsed.events, offset)
    return {"aligned": True, "by": f"the steps of {beside}", "offset_s": round(offset, 3)}, \
        gpu, host


def _join(log: str, parsed: Any, more: list[str]) -> tuple[list, list[Event]]:
    """The steps and events of the log and of the job's later logs, with each log's attempt
    marks (``<log>.attempts``, else the log as one attempt), in time order."""
    from monitor.analysis.attempt_logs import join_logs
    from monitor.logs.canonical_records import parse_file

    return join_logs([(log, parsed), *((p, parse_file(p)) for p in more)])


def _attempts(args: argparse.Namespace, steps: list, events: list[Event], flags: list,
              job_config: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ledger across the job's attempts and the checkpoint cadence (``--mtbf-hours``)."""
    from monitor.analysis.attempts import job_ledger
    from monitor.analysis.cadence import cadence

    ledger = job_ledger(steps, events, flags)
    mtbf = getattr(args, "mtbf_hours", None)
    return ledger, cadence(ledger, steps, job_config,
                           mtbf_s=None if mtbf is None else mtbf * 3600.0)


def _headline(log: str, steps: list, events: list[Event], flags: list, gp_doc: dict,
              config: Any):
    """The report's headline (``monitor.analysis.headline``): the whole run's ledger, the flags
    still open at its end, and its end where the log (or the exit marker beside it) says it
    ended; the Overview's and wandb's computation."""
    from monitor.analysis.headline import RunEnd, headline
    from monitor.hang.finish import exit_after_steps, finish_time

    seconds = None
    if gp_doc and gp_doc.get("gpu_seconds_total"):
        seconds = {"productive": gp_doc["productive"], **gp_doc["lost"],
                   "unattributed": gp_doc["unattributed"]}
    end = finish_time(events, steps) or exit_after_steps([log], steps)
    last = max((int(s.step) for s in steps), default=None)
    run_end = None if end is None else RunEnd(float(end[0]), last, end[1])
    return headline(seconds, flags, span="the run", finished=run_end,
                    suppress=config.section("suppress"))


def table_file_problem(path: str, flag: str) -> str | None:
    """None when ``path`` may be a CSV or Parquet table, else the one-line reason."""
    head = _head(path, "a CSV or Parquet file")
    if isinstance(head, str):
        return f"{flag} {head}"
    if head.startswith(b"PAR1"):
        return None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if b"\x00" in head or exc.start < len(head) - 4:  # not a character cut at the end
            return (f"{flag} {path}: is neither CSV nor Parquet (samples as `verl-monitor "
                    f"export` writes them: gpu.csv, host.csv)")
    return None


@exits("analyze")
def run(args: argparse.Namespace) -> int:
    """Run ``analyze``; 0 on success, 2 when an input cannot be read."""
    from monitor.config import ConfigError
    from monitor.extras import explain_missing
    from monitor.logs.canonical_records import LogReadError

    fail_if(getattr(args, "wandb", None) and explain_missing("wandb", "--wandb"))
    for path in (args.log, *(getattr(args, "more_logs", None) or []), args.gpu, args.host,
                 getattr(args, "events", None),
                 getattr(args, "rollout", None),
                 getattr(args, "fr_dir", None), getattr(args, "stacks", None)):
        if path and not os.path.exists(path):
            raise CommandError(f"{path}: no such file")
    problem = None
    for log in (args.log, *(getattr(args, "more_logs", None) or [])):
        problem = problem or log_file_problem(log)
    for flag, path in (("--gpu", args.gpu), ("--host", args.host),
                       ("--rollout", getattr(args, "rollout", None))):
        problem = problem or (path and table_file_problem(path, flag))
    fail_if(problem)
    try:
        doc = build_document(args)
    except (FrameError, LogReadError, ConfigError, EventsFileError, NoVerlLines) as exc:
        raise CommandError(str(exc).splitlines()[0] if str(exc) else
                           exc.__class__.__name__) from exc
    if args.json:
        text = json.dumps(doc, allow_nan=False) + "\n"
    else:
        from monitor.report import render_text

        text = render_text(doc)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `analyze ... | head`
        sys.stderr.close()
    return failed_on(doc, getattr(args, "fail_on", None))


def failed_on(doc: dict[str, Any], severity: str | None) -> int:
    """``--fail-on``: 1 when the run raised a flag of ``severity`` or worse (said on stderr
    in one line), else 0."""
    if severity is None:
        return 0
    from monitor.records import SEVERITIES

    rank = {s: i for i, s in enumerate(SEVERITIES)}
    hits = [f for f in doc.get("flags") or ()
            if rank.get(f.get("severity"), -1) >= rank[severity]]
    if not hits:
        return 0
    kinds = ", ".join(sorted({f"{f['kind']} ({f['severity']})" for f in hits}))
    warn("analyze", f"--fail-on {severity}: {len(hits)} flag(s) at {severity} or worse: {kinds}")
    return 1
