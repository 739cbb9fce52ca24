"""The goodput digest: every N hours, one Slack message saying where the GPU time went.

"last 6 h: goodput 61%; lost 14% to the rollout long tail, 9% to data loading, 5% to weight
sync; 1% unattributed (96.0 GPU-hours)". Built from the goodput counters' growth over the
period (``monitor.analysis.goodput`` causes), so it needs nothing but what the exporter counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monitor.analysis.goodput import LOST_CAUSES
from monitor.notify.slack import slack_escape

#: How each cause reads in a sentence.
CAUSE_WORDS: dict[str, str] = {
    "warmup": "the warm-up steps",
    "data_loading": "data loading",
    "rollout_long_tail": "the rollout long tail",
    "straggler_wait": "waiting on a straggler",
    "weight_sync": "weight sync",
    "communication": "communication",
    "cpu_phases": "GPUs idle in CPU phases",
    "validation_checkpoint": "validation and checkpoints",
    "low_activity": "low activity in compute phases",
    "restarts": "restarts",
    "waiting_for_samples": "the trainer waiting for samples (the rollout pool)",
    "waiting_for_weights": "the rollout waiting for weights (the trainer pool)",
    "parameter_sync": "weight sync between the pools",
    "preempted_work": "preempted rollout work",
}


def by_cause(snapshot: Mapping[tuple[Any, ...], float]) -> dict[str, float]:
    """GPU-seconds per cause from the goodput collector's ``{(node, gpu, cause): seconds}``."""
    out: dict[str, float] = {}
    for key, seconds in snapshot.items():
        cause = str(key[-1])
        out[cause] = out.get(cause, 0.0) + float(seconds)
    return out


def growth(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Seconds per cause added between two ``by_cause`` readings (a restart counts from 0)."""
    out: dict[str, float] = {}
    for cause, value in after.items():
        base = float(before.get(cause, 0.0))
        out[cause] = float(value) - base if value >= base else float(value)
    return out


def digest_text(seconds: Mapping[str, float], hours: float, top: int = 3) -> str | None:
    """The digest sentence, or None when the period holds no GPU time."""
    total = sum(float(v) for v in seconds.values())
    if total <= 0:
        return None
    share = {c: float(v) / total for c, v in seconds.items()}
    lost = sorted(((share.get(c, 0.0), c) for c in LOST_CAUSES if share.get(c, 0.0) > 0),
                  reverse=True)[:top]
    parts = [f"last {hours:g} h: goodput {share.get('productive', 0.0) * 100:.0f}%"]
    if lost:
        parts.append("lost " + ", ".join(f"{s * 100:.0f}% to {CAUSE_WORDS.get(c, c)}"
                                         for s, c in lost))
    tail = f"{share.get('unattributed', 0.0) * 100:.0f}% unattributed" \
        if share.get("unattributed", 0.0) >= 0.005 else ""
    text = "; ".join(parts)
    if tail:
        text += f"; {tail}"
    return text + f" ({total / 3600:.1f} GPU-hours)"


def digest_message(text: str, run: str | None = None) -> dict[str, Any]:
    """A Slack Block Kit payload for the digest (plain text fallback included). The text and
    the run name are escaped to Slack's rules (``slack_escape``): they show as written, never
    as a mention or a link."""
    title = "Goodput digest" + (f" - {run}" if run else "")
    return {
        "text": slack_escape(f"{title}: {text}"),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(text[:2900])}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text":
             "Every GPU-second of the run by cause: docs/goodput.md"}]},
        ],
        "meta": {"kind": "goodput_digest"},
    }
