"""The plain-text report of ``verl-monitor analyze``: aligned tables, one section per question.

``render_text(doc)`` takes the same document ``analyze --json`` prints (``version_guess``,
``summary`` from ``monitor.analysis.summary.summarize``, ``flags``, optional ``attribution``
rows, ``parse`` counters) and returns the text. ``table(headers, rows)`` is the aligned-table
helper, reusable elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from monitor.logs.clocks import CLOCK_WORDS
from monitor.numbers import finite_float as _num
from monitor.printable import printable

_GIB = float(2**30)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: int = 2, align: str = ""
) -> str:
    """An aligned text table. ``align`` gives one letter per column, ``l`` or ``r``; by
    default the first column is left-aligned and the others right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align = align or ("l" + "r" * (len(headers) - 1))
    lines = []
    for n, row in enumerate(cells):
        parts = [
            row[i].ljust(widths[i]) if align[i] == "l" else row[i].rjust(widths[i])
            for i in range(len(headers))
        ]
        lines.append(" " * indent + "  ".join(parts).rstrip())
        if n == 0:
            lines.append(" " * indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def secs(value: Any) -> str:
    """Seconds for people: 0.042 -> '42 ms', 12.3 -> '12.3 s', 4000 -> '1h 06m'."""
    v = _num(value)
    if v is None:
        return "-"
    if abs(v) < 1:
        return f"{v * 1000:.0f} ms"
    if abs(v) < 100:
        return f"{v:.2f} s"
    if abs(v) < 3600:
        return f"{v:.0f} s"
    return f"{int(v // 3600)}h {int(v % 3600 // 60):02d}m"


def pct(value: Any, digits: int = 1) -> str:
    """A 0..1 ratio as a percentage ('-' when unknown)."""
    v = _num(value)
    return "-" if v is None else f"{v * 100:.{digits}f}%"


def num(value: Any, fmt: str = ".1f") -> str:
    """A number with ``fmt`` ('-' when unknown)."""
    v = _num(value)
    return "-" if v is None else format(v, fmt)


#: Set while a report of a log with relative times is written (``render_text``): times are
#: then offsets from the run's start, never dates.
_RELATIVE: ContextVar[bool] = ContextVar("relative_times", default=False)
#: Set while a report of a log with no time at all is written (no step, no dated line).
_UNTIMED: ContextVar[bool] = ContextVar("untimed", default=False)


def when(ts: Any) -> str:
    """Unix seconds as 'YYYY-MM-DD HH:MM:SS UTC'; in a report of a log without a clock
    (relative times), the offset from the run's start as '+H:MM:SS (run time)'."""
    v = _num(ts)
    if v is None:
        return "-"
    if _UNTIMED.get():
        return "(time unknown: no line of the log is dated)"
    if _RELATIVE.get():
        sign = "-" if v <= -0.5 else "+"
        whole = int(round(abs(v)))
        return f"{sign}{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d} (run time)"
    try:
        return datetime.fromtimestamp(v, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # past what a date can say: the number
        return f"{v:g} (unix seconds)"


#: Beside a time of a log whose step times are rebuilt (no clock in it: ending at the file's
#: modification time), so no one reads it as when the run happened.
ESTIMATED = " (estimated)"


def times_estimated(summary: dict[str, Any]) -> bool:
    """True when the run's dates were not measured (``wall.dated``): rebuilt from the step
    times, or tqdm's spacing placed to end at the log's end."""
    wall = summary.get("wall") or {}
    if _RELATIVE.get():
        return False  # run time says it already
    return bool(wall) and wall.get("clock") is not None and not wall.get(
        "dated", wall.get("measured", True))


def _section(title: str, body: str) -> str:
    return f"{title}\n{body}" if body else title


def _steps_section(summary: dict[str, Any]) -> str:
    st = summary["steps"]
    if not st["count"]:
        return "  no training steps found in this log"
    lines = [
        f"  {st['count']} step records, step {st['first']} .. {st['last']} "
        f"({st['distinct']} distinct), {st['resumes']} resume(s)"
    ]
    w = summary.get("wall") or {}
    if st.get("start_time") is not None:
        span = (st["end_time"] or 0) - st["start_time"]
        sources = ", ".join(f"{CLOCK_WORDS.get(k, k)} {v}"
                            for k, v in st.get("time_sources", {}).items())
        mark = ESTIMATED if times_estimated(summary) else ""
        lines.append(
            f"  from {when(st['start_time'])}{mark} to {when(st['end_time'])}{mark} "
            f"({secs(span)}); end times: {sources}"
        )
    if w.get("span_s"):
        span = w["span_s"]
        clock = CLOCK_WORDS.get(w.get("clock") or "", w.get("clock") or "?")
        line = (f"  wall time {secs(span)} (clock: {clock}): step timers "
                f"{secs(w['steps_s'])} ({pct(w['steps_s'] / span)})")
        if w.get("data_wait_s") is not None:
            line += (f", before the step timers (fetching batches) {secs(w['data_wait_s'])} "
                     f"({pct(w['data_wait_s'] / span)}; most {secs(w['data_wait_max_s'])} before "
                     f"step {w['data_wait_max_step']}), other {secs(w['other_s'])}")
        elif w.get("measured"):
            line += ("; the time between steps (fetching batches) is unknown: the clock is too "
                     "coarse or inconsistent for it")
        else:
            line += ("; time spent between steps (fetching batches) is unknown: the log has "
                     "no timestamps, tqdm bar or dated lines, and no .arrivals file beside it")
        lines.append(line)
    t = summary["step_time"]
    if t["count"]:
        lines.append(
            f"  step time: mean {secs(t['mean'])}, p50 {secs(t['p50'])}, p95 {secs(t['p95'])}, "
            f"max {secs(t['max'])}, variation {pct(t.get('cv'))}"
        )
    return "\n".join(lines)


def _phases_section(summary: dict[str, Any]) -> str:
    rows = [
        [p["phase"], p["steps"], secs(p["mean"]), secs(p["p50"]), secs(p["p95"]), secs(p["max"]),
         pct(p["share"])]
        for p in summary["phases"]
    ]
    if not rows:
        return "  no phase timers in this log"
    return table(["phase", "steps", "mean", "p50", "p95", "max", "share of wall"], rows)


def _throughput_section(summary: dict[str, Any]) -> str:
    t = summary["throughput"]
    if not t["count"]:
        return "  no throughput reported (perf/throughput)"
    line = (
        f"  tokens/s per GPU: mean {num(t['mean'], ',.0f')}, p50 {num(t['p50'], ',.0f')}, "
        f"min {num(t['min'], ',.0f')}, max {num(t['max'], ',.0f')}"
    )
    if t.get("trend") is not None:
        line += (
            f"\n  trend: first quarter {num(t['first_quarter'], ',.0f')} -> last quarter "
            f"{num(t['last_quarter'], ',.0f')} ({'+' if t['trend'] >= 0 else ''}"
            f"{pct(t['trend'])})"
        )
    return line


def _reshard_section(summary: dict[str, Any]) -> str:
    r = summary["reshard"]
    if not r["count"]:
        return "  no weight-sync time in this log (verl <= 0.4.0 hides it inside gen)"
    line = (
        f"  {r['count']} steps: median {secs(r['median'])}, p95 {secs(r['p95'])}, "
        f"max {secs(r['max'])}; {r['spike_count']} spike(s) above 2x the rolling median"
    )
    if r["spikes"]:
        rows = [[s["step"], secs(s["seconds"]), secs(s["rolling_median"])] for s in r["spikes"]]
        line += "\n" + table(["step", "reshard", "rolling median"], rows, indent=4)
    return line


def _ratios_section(summary: dict[str, Any]) -> str:
    lt = summary["long_tail"]
    lines = []
    if lt["count"]:
        what = (
            "slowest / mean agent-loop generate_sequences"
            if lt["source"] == "agent_loop"
            else "response_length max / mean"
        )
        lines.append(
            f"  rollout long tail ({what}): median {num(lt['median'], '.2f')}x, "
            f"p95 {num(lt['p95'], '.2f')}x, max {num(lt['max'], '.2f')}x"
        )
    else:
        lines.append("  rollout long tail: no agent-loop timers or response lengths")
    dp = summary["dp_imbalance"]
    if dp["count"]:
        lines.append(
            f"  data-parallel token imbalance (global_seqlen minmax_diff / mean): "
            f"mean {pct(dp['mean'])}, max {pct(dp['max'])}"
        )
    else:
        lines.append("  data-parallel token imbalance: no global_seqlen keys")
    mem = summary["memory"]
    if mem["allocated_peak_bytes"] is not None or mem["reserved_peak_bytes"] is not None:
        alloc = _num(mem["allocated_peak_bytes"])
        res = _num(mem["reserved_peak_bytes"])
        lines.append(
            f"  GPU memory peak: allocated {'-' if alloc is None else f'{alloc / _GIB:.1f} GiB'}"
            f", reserved {'-' if res is None else f'{res / _GIB:.1f} GiB'}"
        )
    return "\n".join(lines)


def _events_section(summary: dict[str, Any]) -> str:
    ev = summary["events"]
    if not ev["counts"]:
        return "  none"
    counts = ", ".join(f"{k} {v}" for k, v in sorted(ev["counts"].items()))
    lines = [f"  {counts}"]
    rows = [[e["kind"], e["step"] if e["step"] is not None else "-", when(e["time"]),
             e["message"][:90]] for e in ev["listed"]]
    if rows:
        lines.append(table(["kind", "step", "time", "message"], rows, indent=4, align="lrll"))
    if ev["listed_total"] > len(ev["listed"]):
        lines.append(f"    ... and {ev['listed_total'] - len(ev['listed'])} more")
    return "\n".join(lines)


def _attribution_section(rows: list[dict[str, Any]] | None) -> str | None:
    """'GPU activity per phase': one row per phase (withheld phases included, with their
    sample count), then the reason each withheld phase has no figures."""
    if rows is None:
        return None
    if not rows:
        return "  no GPU samples fall inside the steps' time spans (check --log-end / clocks)"
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_phase.setdefault(str(r["phase"]), []).append(r)
    out = []
    held: list[str] = []
    for phase, items in by_phase.items():
        counts = [c for c in (_num(r.get("full_samples", r.get("samples"))) for r in items)
                  if c is not None]
        n_samples = str(int(min(counts))) if counts else "-"
        utils = [(_num(r.get("util_mean")), r) for r in items]
        utils = [(u, r) for u, r in utils if u is not None]
        sms = [v for v in (_num(r.get("sm_mean")) for r in items) if v is not None]
        if not utils:
            reason = next((str(r["withheld"]) for r in items if r.get("withheld")),
                          "no sample inside the phase")
            out.append([phase, len(items), n_samples, "withheld", "-", "-", "-"])
            held.append(f"  {phase} withheld: {reason}")
            continue
        low_u, low_r = min(utils, key=lambda x: x[0])
        high_u = max(u for u, _ in utils)
        out.append(
            [
                phase,
                len(items),
                n_samples,
                num(sum(u for u, _ in utils) / len(utils)),
                num(sum(sms) / len(sms)) if sms else "-",
                f"{low_r['node']}:{low_r['gpu']} {low_u:.1f}",
                num(high_u - low_u),
            ]
        )
    text = table(["phase", "GPUs", "samples", "util %", "SM active %", "lowest GPU", "spread"],
                 out)
    if held:
        text += "\n  (samples: wholly inside the phase, per GPU, summed over the steps)\n"
        text += "\n".join(held)
    return text


def _goodput_section(gp: dict[str, Any] | None) -> str | None:
    """'Where the GPU time went': the goodput ledger's causes, seconds, shares and cost."""
    if gp is None:
        return None
    total = _num(gp.get("gpu_seconds_total")) or 0.0
    if total <= 0:
        return "  no step falls inside the GPU samples' time span (check --log-end / clocks)"
    secs_by = {"productive": gp.get("productive"), **(gp.get("lost") or {}),
               "unattributed": gp.get("unattributed")}
    cost = (gp.get("cost") or {}).get("by_cause") or {}
    rows = []
    for cause, value in secs_by.items():
        v = _num(value) or 0.0
        if cause not in ("productive", "unattributed") and v < 0.005 * total:
            continue  # causes under 0.5% are left out of the table (they stay in --json)
        row = [cause, secs(v), pct(v / total)]
        if cost:
            row.append(num(cost.get(cause), ".2f"))
        rows.append(row)
    headers = ["cause", "GPU time", "share"] + (["cost"] if cost else [])
    lines = [f"  {gp.get('gpus', '?')} GPU(s), {gp.get('steps', '?')} step(s): "
             f"{secs(total)} of GPU time, goodput {pct(gp.get('goodput_share'))}"]
    if gp.get("cost"):
        c = gp["cost"]
        lines.append(f"  at {num(gp.get('gpu_hour_cost'), '.2f')} per GPU-hour: "
                     f"{num(c.get('total'), '.2f')} in all, {num(c.get('lost'), '.2f')} lost")
    lines.append(table(headers, rows))
    lines.append("  (rules and blind spots of each cause: docs/goodput.md)")
    return "\n".join(lines)


#: Trainer modes in words (monitor.logs.modes).
MODE_WORDS: dict[str, str] = {
    "sync": "sync trainer, colocated rollout",
    "agent_loop": "sync trainer, server-mode rollout (agent loop)",
    "one_step_off": "one-step-off policy (separate rollout pool)",
    "separate_async": "V1 separate-async trainer (separate rollout pool)",
    "fully_async_trainer": "fully-async policy, trainer (separate rollout pool)",
    "fully_async_rollouter": "fully-async policy, rollouter statistics",
    "unknown": "unknown (no line names a verl trainer or its GPU layout)",
}


def _pools_section(pools: dict[str, Any] | None) -> str | None:
    """'GPU time per pool': each pool's causes as shares of its time, and overall."""
    if not pools or not pools.get("pools"):
        return None
    lines = []
    for p in pools["pools"]:
        gpus = f"{p['gpus']} GPU(s)" if p.get("gpus") else "GPUs unknown"
        if p.get("note"):
            lines.append(f"  {p['pool']} pool ({gpus}): {p['note']}")
            continue
        source = "GPU samples" if p.get("source") == "gpu" else "log timers"
        busy = p.get("busy_share")
        head = (f"  {p['pool']} pool ({gpus}, from {source}): {secs(p.get('seconds_per_gpu'))} "
                f"per GPU, busy {pct(busy)}")
        if p.get("gpu_seconds"):
            head += f", {secs(p['gpu_seconds'])} of GPU time"
        lines.append(head)
        rows = [[cause, secs(v), pct((p.get("shares") or {}).get(cause))]
                for cause, v in sorted((p.get("causes") or {}).items(), key=lambda kv: -kv[1])]
        lines.append(table(["cause", "time per GPU", "share of the pool"], rows))
        if p.get("preempted_requests") is not None:
            lines.append(f"  preempted requests (work recomputed): "
                         f"{num(p['preempted_requests'], '.0f')}")
    overall = pools.get("overall")
    if overall and len(pools["pools"]) > 1:
        top = sorted((overall.get("shares") or {}).items(), key=lambda kv: -kv[1])
        lines.append(f"  overall ({overall.get('gpus')} GPUs, {secs(overall.get('gpu_seconds'))}): "
                     + ", ".join(f"{c} {pct(v)}" for c, v in top))
    elif len(pools["pools"]) > 1:
        lines.append("  overall: give --trainer-gpus and --rollout-gpus to add the pools up")
    lines.append("  (waiting_for_samples: the trainer's timing_s/gen, a wait in this mode; "
                 "docs/goodput.md)" if any(
                     "waiting_for_samples" in (p.get("causes") or {}) for p in pools["pools"])
                 else "  (causes per pool: docs/goodput.md)")
    return "\n".join(lines)


def scope_text(scope: dict[str, Any] | None) -> str:
    """A flag's scope for people: 'node n0, GPUs 3,5, phase gen, steps 120-140'."""
    parts = []
    for key, val in (scope or {}).items():
        if key == "steps" and isinstance(val, list) and len(val) == 2:
            parts.append(f"step {val[0]}" if val[0] == val[1] else f"steps {val[0]}-{val[1]}")
        elif key == "gpus" and isinstance(val, list):
            parts.append(("GPU " if len(val) == 1 else "GPUs ") + ",".join(map(str, val)))
        elif isinstance(val, list):
            parts.append(f"{key} {','.join(map(str, val))}")
        else:
            parts.append(f"{key} {val}")
    return ", ".join(parts)


def _flags_section(flags: list[dict[str, Any]], mark: str = "") -> str:
    if not flags:
        return "  none: no detector fired"
    blocks = []
    for f in flags:
        scope = scope_text(f.get("scope"))
        state = "open" if f.get("end") is None else f"until {when(f['end'])}{mark}"
        lines = [f"  [{f['severity'].upper()}] {f['kind']}  ({scope or 'run'}; "
                 f"from {when(f['start'])}{mark}, {state})"]
        if f.get("evidence"):
            lines.append(f"    evidence: {f['evidence']}")
        for advice in f.get("advice") or []:
            lines.append(f"    - {advice}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def top_problem_text(top: dict[str, Any] | None) -> str:
    """"  Top problem: rollout_long_tail, 412 s of GPU time (19.5%): <first advice>" (the flag
    that costs the most GPU time; "" without one)."""
    if not top:
        return ""
    text = f"  Top problem: {top['kind']} ({top.get('severity')})"
    if top.get("gpu_seconds"):
        text += f", {secs(top['gpu_seconds'])} of GPU time ({pct(top.get('share'))})"
    advice = top.get("advice") or []
    return text + (f": {advice[0]}" if advice else "")


def render_text(doc: dict[str, Any]) -> str:
    """The whole report as text (see the module docstring for ``doc``). A log without a
    clock (``doc["clock"] == "relative"``) has its times written as run time, not dates."""
    token = _RELATIVE.set(doc.get("clock") == "relative")
    untimed = _UNTIMED.set(doc.get("clock") == "none")
    try:
        return _render(doc)
    finally:
        _RELATIVE.reset(token)
        _UNTIMED.reset(untimed)


def _render(doc: dict[str, Any]) -> str:
    summary = doc["summary"]
    head = [f"verl-monitor analyze: {doc.get('log', '')}"]
    parse = doc.get("parse") or {}
    head.append(
        f"  format {doc.get('format', '?')}, verl version guess {doc.get('version_guess', '?')}"
        + (
            f"; {parse.get('lines', 0)} lines, {parse.get('parse_errors', 0)} unreadable"
            if parse
            else ""
        )
    )
    head += [f"  beside the log: {said}" for said in parse.get("side_files") or []]
    if doc.get("clock") == "relative":
        head.append("  times: relative to the run's start (+H:MM:SS): no line of the log dates "
                    "its steps (no timestamp, dated line or .arrivals file)")
    telemetry = doc.get("telemetry") or {}
    if telemetry.get("aligned") is False:
        head.append(f"  GPU/host samples not used: {telemetry.get('why', '')}")
    printed = doc.get("job_config") or {}
    if printed.get("found"):
        sections = ", ".join(printed.get("sections") or [])
        head.append("  printed config: " + (f"read whole ({sections})" if printed.get("whole")
                    else f"read in part: it has {sections or 'no whole section'}; the rest "
                    "was cut short, so what is not there is not known"))
    mode = doc.get("trainer_mode")
    if mode:
        head.append(f"  trainer: {MODE_WORDS.get(mode, mode)}" + (
            " (from the printed config)" if doc.get("trainer_mode_source") == "config" else ""))
    headline = doc.get("headline") or {}
    if headline.get("text"):  # the Overview's banner, in the same words
        head.append(f"  headline: {headline['text']}")
    parts = [
        "\n".join(head),
        _section("Steps", _steps_section(summary)),
        _section("Phases (seconds per step)", _phases_section(summary) + (
            "\n  (gen: the trainer waiting for samples from the rollout pool, not generation)"
            if mode in ("one_step_off", "separate_async", "fully_async_trainer") else "")),
        _section("Throughput", _throughput_section(summary)),
        _section("Weight sync (reshard)", _reshard_section(summary)),
        _section("Balance and memory", _ratios_section(summary)),
        _section("Events", _events_section(summary)),
    ]
    attrib = _attribution_section(doc.get("attribution"))
    if attrib is not None:
        parts.append(_section("GPU activity per phase (from --gpu)", attrib))
    goodput = _goodput_section(doc.get("goodput"))
    if goodput is not None:
        parts.append(_section("Where the GPU time went", goodput))
    hang = doc.get("hang")
    if hang:
        lines = [f"  Flight Recorder dumps of {len(hang['ranks'])} rank(s): "
                 + ",".join(str(r) for r in hang["ranks"][:16])
                 + ("..." if len(hang["ranks"]) > 16 else ""), f"  {hang['summary']}"
                 ] if hang.get("ranks") else []
        stacks = hang.get("stacks")
        if stacks:  # analyze --stacks: the newest saved py-spy round, judged again
            lines += [f"  py-spy rounds: {stacks['rounds']}; the newest: {stacks['summary']}"]
            lines += [f"  not read: {said}" for said in stacks.get("problems") or []]
        lines += [f"  cannot read: {k}: {v}" for k, v in sorted(hang.get("problems", {}).items())]
        parts.append(_section("Who holds the others", "\n".join(lines)))
    pools = _pools_section(doc.get("pools"))
    if pools is not None:
        parts.append(_section("GPU time per pool", pools))
    from monitor.analysis.attempts_report import section as attempts_section

    attempts = attempts_section(doc)
    if attempts is not None:
        parts.append(_section("Attempts of the job", attempts))
    flags = doc.get("flags") or []
    top = top_problem_text(doc.get("top_problem"))
    parts.append(_section(f"Flags ({len(flags)})", (top + "\n" if top else "")
                          + _flags_section(flags, ESTIMATED if times_estimated(summary)
                                           else "")))
    premises = premises_section(doc.get("premises") or [])
    if premises:
        parts.append(_section("Not judged (a premise fails or cannot be judged)", premises))
    # every text from outside (log lines, py-spy frames, file names) shown inert (issue 41)
    return printable("\n\n".join(parts) + "\n")


def premises_section(judged: list[dict[str, Any]]) -> str:
    """The readings the detectors did not make, grouped by why: premises that fail ("does
    not apply") and premises that could not be judged ("unknown"), one line per reason."""
    groups: dict[tuple[bool | None, str, str], list[str]] = {}
    for j in judged:
        key = (j.get("holds"), str(j.get("needs", "")), str(j.get("why", "")))
        reading = str(j.get("reading", ""))
        if not reading.startswith("advice:"):
            groups.setdefault(key, []).append(reading)
    lines = []
    for (holds, needs, why), readings in groups.items():
        verdict = "does not apply" if holds is False else "unknown"
        lines.append(f"  {', '.join(readings)}: {verdict}: needs {needs}; {why}.")
    return "\n".join(lines)
