"""``verl-monitor simulate``: write a simulated verl run (logs, telemetry, truth) to a folder."""

from __future__ import annotations

import argparse
from datetime import datetime

from cli.errors import CommandError, exits, fail_if
from monitor.sim.engine import LOG_FORMATS, SimRun
from monitor.sim.scenarios import SIM_MODES, UnknownScenario, describe, list_scenarios
from monitor.sim.versions import VERSIONS, UnknownVersion


def _start_time(text: str) -> float:
    if text == "now":
        import time

        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"bad start time {text!r}: want 'now', unix seconds or ISO 8601"
        ) from exc
    return dt.timestamp()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


#: How ``verl-monitor simulate`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "write a simulated verl run (train.log, gpu.csv, host.csv, truth.json)",
    "description": ("Simulate a verl run with an injected problem and write its console log "
        "(in the chosen verl release's format), GPU and host telemetry (interchange CSV) and "
        "truth.json (what was injected, when, where). Deterministic for a seed. Scenarios: "
        + ", ".join(list_scenarios())),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``verl-monitor simulate``."""
    p.add_argument("--scenario", default="healthy",
                   help="scenario or script name, or a script 'name:steps,name:steps' "
                   "(default: healthy; --list shows them)")
    p.add_argument("--list", action="store_true", help="list scenarios with a line each and exit")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="steps to plan (default 60; a script keeps its own length)")
    p.add_argument("--nodes", type=_positive_int, default=1, help="nodes (default 1)")
    p.add_argument("--gpus-per-node", type=_positive_int, default=8,
                   help="GPUs per node (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--verl-version", default="0.7.1",
                   help=f"verl release whose log format to write: {', '.join(VERSIONS)} "
                   "(default 0.7.1)")
    p.add_argument("--step-seconds", type=_positive_float, default=None,
                   help="healthy step time in seconds (default 30; 12 for the demo script)")
    p.add_argument("--noise", type=float, default=1.0,
                   help="noise scale of telemetry and timings (default 1.0; 0 = none)")
    p.add_argument("--timestamps", action="store_true",
                   help="prefix each log line with an ISO 8601 timestamp")
    p.add_argument("--jsonl", action="store_true", help="also write the file logger's train.jsonl")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="console",
                   help="console (verl's step:N lines) or breakdown ('Step N: total=..ms | ...')")
    p.add_argument("--start", type=_start_time, default=None,
                   help="start time: 'now', unix seconds or ISO 8601 (default 2026-01-01T00:00Z)")
    p.add_argument("--trainer-mode", choices=SIM_MODES, default=None,
                   help="trainer to simulate: sync (colocated), agent_loop (vLLM servers "
                   "behind the agent loop), fully_async (the fully-async trainer, a separate "
                   "rollout pool) or separate_async (the V1 trainer); default: the one the "
                   "scenario needs, else sync. All but sync also write rollout.csv (the "
                   "engines' series)")
    p.add_argument("--out", help="output folder (created if missing)")


#: SimRun's keywords that the options of the same name give as they are.
_SAME_NAMED = ("scenario", "steps", "nodes", "gpus_per_node", "seed", "verl_version",
               "step_seconds", "noise", "timestamps", "log_format")


@exits("simulate")
def run(args: argparse.Namespace) -> int:
    """Build the run and write its files; 2 on a bad scenario, version or output folder."""
    if args.list:
        for name in list_scenarios():
            print(f"{name:24s} {describe(name)}")
        return 0
    fail_if(not args.out and "--out DIR is required")
    try:
        sim = SimRun(**{key: getattr(args, key) for key in _SAME_NAMED},
                     start_time=args.start, mode=args.trainer_mode)
    except (UnknownScenario, UnknownVersion, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    try:
        sim.write(args.out, jsonl=args.jsonl)
    except OSError as exc:
        raise CommandError(f"cannot write to {args.out}: {exc.strerror or exc}") from exc
    kinds = sorted({e["kind"] for e in sim.truth})
    print(
        f"wrote {args.out}: {len(sim.steps)} steps ({sim.outcome}), verl {sim.verl_version} "
        f"{sim.mode} trainer, "
        f"{sim.nodes}x{sim.gpus_per_node} GPUs, "
        f"{(sim.end_time - sim.start_time) / 60:.1f} min; truth: {', '.join(kinds) or 'none'}"
    )
    return 0
