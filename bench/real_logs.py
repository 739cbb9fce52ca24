"""The real corpus through ``verl-monitor analyze --json``, judged by properties that need no
hand label (``tests/real_log_properties.py``): for every log of
``tests/fixtures/real_logs/manifest.json`` that is here, each property's verdict; for every
failure of ``tests/fixtures/real_failures/manifest.json``, the first advice against the
thread's fix; then the totals.

The logs are found by ``tests/real_logs.py`` (``tests/fixtures/real_logs/<name>.log``,
``../shared/real_logs/<name>.log``, or a local snapshot of their repository); one that is in
no place is listed as not here. The failures are the quoted lines committed beside their
manifest.

    .venv/bin/python bench/real_logs.py [--out FILE] [--failures-out FILE] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.real_log_properties import (  # noqa: E402
    PROPERTIES,
    Verdict,
    advice_matches,
    failure_quote,
    first_advice,
    judge,
)
from tests.real_logs import HERE, SHARED, analyze_doc, entries, false_flags, load  # noqa: E402

FAILURES = ROOT / "tests" / "fixtures" / "real_failures"


def _read_from(log: Path) -> str:
    if log.parent == HERE:
        return "committed copy"
    if log.parent == SHARED:
        return "../shared/real_logs"
    return "snapshot of the repository"


def judge_logs(cache: Path, only: set[str]) -> tuple[list[str], dict[str, dict[str, Verdict]]]:
    """One block of text per manifest log, and each present log's verdicts."""
    blocks, verdicts = [], {}
    for entry in entries():
        if only and entry.name not in only:
            continue
        head = f"{entry.name}  ({entry.repo}@{entry.commit[:10]}:{entry.path})"
        log = load(entry, cache)
        if log is None:
            blocks.append(f"{head}\n  not here (no placed copy, no snapshot): not judged\n")
            continue
        started = time.perf_counter()
        try:
            doc = analyze_doc(log)
        except Exception as exc:  # noqa: BLE001 - a crash of analyze is a finding, recorded
            blocks.append(f"{head}\n  analyze CRASHED: {exc.__class__.__name__}: {exc}\n")
            verdicts[entry.name] = {p: Verdict("violation", "analyze crashed") for p in PROPERTIES}
            continue
        took = time.perf_counter() - started
        found = judge(doc, log.read_text(errors="replace"))
        verdicts[entry.name] = found
        lines = [head,
                 f"  read from {_read_from(log)}; analyze {took:.1f} s; {entry.mode} "
                 f"(manifest), read {doc['trainer_mode']} ({doc.get('trainer_mode_source')}); "
                 f"{doc['summary']['steps']['count']} steps; clock "
                 f"{doc['summary']['wall'].get('clock')}"]
        for name, verdict in found.items():
            lines.append(f"  {name:<13} {verdict.status:<9} {verdict.detail}")
        flags = [f"{f['kind']} ({f['severity']})" for f in doc["flags"]
                 if f["severity"] in ("warning", "critical")]
        lines.append("  flags: " + (", ".join(dict.fromkeys(flags)) or "none"))
        if entry.healthy:
            wrong = false_flags(doc, log)
            lines.append("  healthy run: " + ("; ".join(wrong) if wrong else "no false flag"))
        else:
            said = " ".join(first_advice(doc).split())
            lines.append("  first advice: " + (said[:200] or "(none)"))
        blocks.append("\n".join(lines) + "\n")
    return blocks, verdicts


def totals(verdicts: dict[str, dict[str, Verdict]]) -> list[str]:
    """Per property: how many texts held, failed, could not be judged; each violation."""
    out = [f"TOTALS (texts judged: {len(verdicts)})"]
    violations = 0
    for prop in PROPERTIES:
        counts = {"ok": 0, "violation": 0, "n/a": 0}
        bad = []
        for name, found in verdicts.items():
            counts[found[prop].status] += 1
            if found[prop].status == "violation":
                bad.append(f"    {name}: {found[prop].detail}")
        violations += counts["violation"]
        out.append(f"  {prop:<13} ok {counts['ok']:>3}  violation {counts['violation']:>3}  "
                   f"n/a {counts['n/a']:>3}")
        out += bad
    out.append(f"  violations in all: {violations}")
    return out


def judge_failures(cache: Path) -> tuple[list[str], int, int]:
    """The failure table (case, expected cause, our first advice, match) and the counts."""
    manifest = FAILURES / "manifest.json"
    cases: list[dict[str, Any]] = json.loads(manifest.read_text()) if manifest.exists() else []
    rows = [f"{'case':<58} {'expected cause':<24} {'match':<5} our first advice (120 chars)"]
    matched = 0
    for case in cases:
        quote = cache / f"{case['name']}.log"
        quote.write_text(failure_quote((FAILURES / f"{case['name']}.txt").read_text()))
        try:
            advice = first_advice(analyze_doc(quote))
        except Exception as exc:  # noqa: BLE001 - recorded as the finding it is
            advice = f"analyze CRASHED: {exc.__class__.__name__}"
        good = advice_matches(advice, case["expected"])
        matched += good
        shown = " ".join(advice.split())[:120] or "(no advice)"
        rows.append(f"{case['name']:<58} {case['expected']['cause']:<24} "
                    f"{'yes' if good else 'no':<5} {shown}")
    rate = f"{matched}/{len(cases)} ({100 * matched / len(cases):.0f}%)" if cases else "0/0"
    rows.append(f"first-advice matches: {rate}")
    return rows, matched, len(cases)


def main() -> int:
    """Print (and with ``--out``/``--failures-out`` write) the verdicts and the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--failures-out", default=None)
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        blocks, verdicts = judge_logs(Path(tmp), set(args.only))
        rows, _, _ = judge_failures(Path(tmp)) if not args.only else ([], 0, 0)
    text = "\n".join(blocks) + "\n" + "\n".join(totals(verdicts)) + "\n"
    print(text)
    print("\n".join(rows))
    if args.out:
        Path(args.out).write_text(text)
    if args.failures_out and rows:
        Path(args.failures_out).write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
