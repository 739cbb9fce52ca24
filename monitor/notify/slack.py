"""Slack notifications through an incoming webhook, for one machine without Alertmanager.

API::

    notifier = SlackNotifier("~/.slack-webhook", store)   # store: RunStore or None
    notifier.notify_opened(flag)     # queue "flag opened" (returns the outbox id, or None
    notifier.notify_resolved(flag)   #  when filtered by severity or de-duplicated)
    notifier.deliver()               # send what is due; returns how many were sent
    notifier.start(interval_s=5.0)   # or deliver from a background thread; notifier.stop()
    notifier.sent, notifier.failed_attempts, notifier.pending, notifier.last_error

- The webhook URL is read from a file (first non-empty line) and never logged or put in an
  error message; a missing or empty file raises ``SlackConfigError`` naming the file.
- Messages use Block Kit: a header with kind and severity, fields for severity, scope and
  start time (resolved messages add the end and the duration), the evidence, and the advice as
  bullets. Flags below ``min_severity`` are not sent.
- Every message goes to an outbox first: the store's ``outbox`` table (it survives restarts),
  or memory when ``store`` is None (bounded: see monitor/notify/outbox.py). ``deliver()`` sends
  due messages oldest first with slack_sdk's ``WebhookClient``; on HTTP 429, 5xx or a failure
  to connect or send it retries with exponential backoff (``retry_base_s``, at most
  ``max_attempts`` tries per call) and honours ``Retry-After``; a message that still fails
  stays in the outbox with its next attempt scheduled, and is delivered by a later call.
- ``rate_limit_per_min``: at most that many messages in any 60 s; the rest wait.

Exactly once per flag episode, in order:

- An episode is one flag from its start: kind + scope + start time (two OOMs 85 s apart are
  two episodes, even with the same empty scope). Its "opened" and its "resolved" message are
  each queued once, ever (the outbox remembers the episode id across restarts).
- "resolved" waits until the episode's "opened" is done; a "resolved" whose "opened" was never
  queued is not sent (a person never reads "resolved" for something never announced).
- Timeouts never cause a second post. Slack webhooks have no idempotency key, so a request
  whose body was sent but whose answer never came (read timeout, connection reset while
  waiting) may have been posted: the message is *not* retried (at most once), counted in
  ``outcomes["unknown"]`` and logged once with its episode. Only failures where Slack cannot
  have received the body (cannot connect, cannot send) or answered with 429/5xx are retried.
  ``timeout_s`` defaults to 10 s (Slack answers in well under a second) so this stays rare.
- The webhook URL (its secret path) never reaches an error message, the log or the store:
  every error text goes through :meth:`SlackNotifier.redact`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
import urllib.error
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from monitor.notify.outbox import MemoryOutbox
from monitor.records import SEVERITIES, Flag

_SEVERITY_ICON = {"info": ":information_source:", "warning": ":warning:",
                  "critical": ":rotating_light:"}
_TEXT_LIMIT = 2900  # Slack caps a section's text at 3,000 characters
_HEADER_LIMIT = 150
#: Slack's webhook secret path (``T…/B…/token``), wherever it shows up.
_HOOK_PATH = re.compile(r"(?:https?://[^\s\"']*)?/?services/[A-Za-z0-9_/\-]+|"
                        r"\bT[A-Z0-9]{6,}/B[A-Z0-9]{6,}/[A-Za-z0-9]{8,}")
log = logging.getLogger("verl_monitor.notify")


def episode_id(flag: Flag) -> str:
    """One flag episode: kind, scope and start time (the same flag later is another one)."""
    return f"{flag.kind}|{flag.scope_label}|{float(flag.start):.3f}"


class SlackConfigError(ValueError):
    """The webhook URL file cannot be used; the message names the file, never the URL."""


def read_webhook_url(path: str | os.PathLike[str]) -> str:
    """The incoming-webhook URL from ``path``; raises SlackConfigError (URL never shown)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SlackConfigError(f"{p}: no such file (Slack webhook URL file)") from exc
    except OSError as exc:
        raise SlackConfigError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    url = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not url:
        raise SlackConfigError(f"{p}: empty (expected a Slack incoming-webhook URL)")
    if not (url.startswith("https://") or url.startswith("http://")):
        raise SlackConfigError(f"{p}: does not hold an http(s) URL")
    return url


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scope_text(flag: Flag) -> str:
    from monitor.report import scope_text

    return scope_text(flag.scope) or "whole run"


def _slack_date(ts: float) -> str:
    """Slack's date formatting (shown in the reader's time zone) with a UTC fallback."""
    fallback = datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"<!date^{int(ts)}^{{date_short_pretty}} {{time_secs}}|{fallback}>"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"


def build_message(flag: Flag, state: str, *, run: str | None = None) -> dict[str, Any]:
    """The webhook payload (``text`` fallback plus Block Kit ``blocks``) for a flag.

    ``state`` is ``"opened"`` or ``"resolved"``.
    """
    scope = _scope_text(flag)
    sev = flag.severity.upper()
    if state == "resolved":
        title = f"Resolved: {flag.kind} ({flag.severity})"
        icon = ":white_check_mark:"
    else:
        title = f"{flag.kind} ({flag.severity})"
        icon = _SEVERITY_ICON.get(flag.severity, ":warning:")
    text = f"{icon} [{sev}] {'resolved: ' if state == 'resolved' else ''}{flag.kind} — {scope}"
    if flag.evidence:
        text += f": {flag.evidence}"
    fields = [
        {"type": "mrkdwn", "text": f"*Severity*\n{sev}"},
        {"type": "mrkdwn", "text": f"*Scope*\n{_clip(scope, 500)}"},
        {"type": "mrkdwn", "text": f"*Started*\n{_slack_date(flag.start)}"},
    ]
    if state == "resolved" and flag.end is not None:
        fields.append({"type": "mrkdwn", "text": f"*Ended*\n{_slack_date(flag.end)}"})
        fields.append(
            {"type": "mrkdwn", "text": f"*Duration*\n{_duration(flag.end - flag.start)}"}
        )
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(title, _HEADER_LIMIT)}},
        {"type": "section", "fields": fields},
    ]
    if flag.evidence:
        blocks.append({"type": "section", "text": {
            "type": "mrkdwn", "text": _clip(f"*Evidence*\n{flag.evidence}", _TEXT_LIMIT)}})
    if flag.advice and state != "resolved":
        bullets = "\n".join(f"• {a}" for a in flag.advice)
        blocks.append({"type": "section", "text": {
            "type": "mrkdwn", "text": _clip(f"*Advice*\n{bullets}", _TEXT_LIMIT)}})
    context = "verl-monitor" + (f" · run {run}" if run else "")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {
        "text": _clip(text, _TEXT_LIMIT),
        "blocks": blocks,
        "meta": {"kind": flag.kind, "state": state, "scope": flag.scope_label,
                 "severity": flag.severity, "episode": episode_id(flag)},
    }


def _quiet_logger() -> logging.Logger:
    """A logger that never emits: slack_sdk would log the webhook URL at DEBUG level."""
    logger = logging.getLogger("verl_monitor.notify.slack.sdk")
    logger.setLevel(logging.CRITICAL + 10)
    logger.propagate = False
    logger.disabled = True
    return logger


def _retry_after(headers: dict[str, Any] | None) -> float | None:
    for name, value in (headers or {}).items():
        if str(name).lower() == "retry-after":
            if isinstance(value, list):
                value = value[0] if value else None
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                return None
            return seconds if math.isfinite(seconds) and seconds >= 0 else None
    return None


class SlackNotifier:
    """Queue flag notifications and deliver them to a Slack incoming webhook (see module doc)."""

    def __init__(
        self,
        webhook_url_file: str,
        store: Any | None = None,
        *,
        min_severity: str = "warning",
        rate_limit_per_min: int = 10,
        run: str | None = None,
        max_attempts: int = 3,
        retry_base_s: float = 1.0,
        retry_max_s: float = 30.0,
        backoff_max_s: float = 600.0,
        timeout_s: float = 10.0,
    ) -> None:
        if min_severity not in SEVERITIES:
            raise ValueError(f"min_severity must be one of {', '.join(SEVERITIES)}")
        self._url = read_webhook_url(webhook_url_file)
        self.webhook_url_file = str(webhook_url_file)
        self.outbox = store if store is not None else MemoryOutbox()
        self.min_severity = min_severity
        self.rate_limit_per_min = int(rate_limit_per_min)
        self.run = run
        self.max_attempts = max(1, int(max_attempts))
        self.retry_base_s = float(retry_base_s)
        self.retry_max_s = float(retry_max_s)
        self.backoff_max_s = float(backoff_max_s)
        self.sent = 0
        self.failed_attempts = 0
        #: final outcome of each message handled: sent, unknown (timed out after sending,
        #: not retried), skipped ("resolved" without an "opened")
        self.outcomes = {"sent": 0, "unknown": 0, "skipped": 0}
        #: exceptions in the delivery thread (it carries on)
        self.thread_restarts = 0
        self.last_error: str | None = None
        self._sent_times: deque[float] = deque()
        self._deliver_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        from slack_sdk.webhook import WebhookClient

        self._client = WebhookClient(
            self._url, timeout=max(1, math.ceil(timeout_s)), logger=_quiet_logger(),
            retry_handlers=[],
        )

    def __repr__(self) -> str:  # never show the URL
        return f"SlackNotifier(webhook_url_file={self.webhook_url_file!r}, pending={self.pending})"

    def redact(self, text: str) -> str:
        """``text`` without the webhook URL or its secret path (Slack may echo them)."""
        from urllib.parse import urlsplit

        path = urlsplit(self._url).path
        for secret in (self._url, path, path.lstrip("/")):
            if len(secret) > 8:
                text = text.replace(secret, "<webhook>")
        return _HOOK_PATH.sub("<webhook>", text)

    @property
    def dropped(self) -> int:
        """Messages the in-memory outbox dropped at its bound (0 with a store)."""
        return int(getattr(self.outbox, "dropped", 0) or 0)

    # ------------------------------------------------------------------ queueing

    @property
    def pending(self) -> int:
        """Messages waiting in the outbox."""
        return self.outbox.outbox_count_pending()

    def _wanted(self, flag: Flag) -> bool:
        level = SEVERITIES.index(flag.severity) if flag.severity in SEVERITIES else 1
        return level >= SEVERITIES.index(self.min_severity)

    def _enqueue(self, flag: Flag, state: str) -> int | None:
        if not self._wanted(flag):
            return None
        key = f"{episode_id(flag)}|{state}"
        now = time.time()
        if self.outbox.outbox_status(key) is not None:
            return None  # this episode's message was queued already: once, ever
        payload = build_message(flag, state, run=self.run)
        return self.outbox.outbox_add(payload, dedupe_key=key, created=now)

    def notify_opened(self, flag: Flag) -> int | None:
        """Queue a "flag opened" message; None when filtered out or a duplicate."""
        return self._enqueue(flag, "opened")

    def notify_digest(self, payload: dict[str, Any], key: str) -> int | None:
        """Queue a message that is not a flag's (the goodput digest), once per ``key``."""
        dedupe = f"digest|{key}"
        if self.outbox.outbox_status(dedupe) is not None:
            return None
        return self.outbox.outbox_add(payload, dedupe_key=dedupe, created=time.time())

    def notify_resolved(self, flag: Flag) -> int | None:
        """Queue a "flag resolved" message (shows the duration); None when filtered/duplicate."""
        return self._enqueue(flag, "resolved")

    # ------------------------------------------------------------------ delivering

    def _rate_ok(self, now: float) -> bool:
        while self._sent_times and now - self._sent_times[0] >= 60.0:
            self._sent_times.popleft()
        return len(self._sent_times) < self.rate_limit_per_min

    def _post(self, payload: dict[str, Any]) -> tuple[str, str | None, float | None, bool]:
        """One POST: (result, error in words, retry-after seconds, retryable).

        result: "ok"; "failed" (Slack did not take it: retry per ``retryable``); "unknown"
        (the body went out and no answer came: it may be posted, so it is not retried)."""
        try:
            resp = self._client.send(text=payload.get("text"), blocks=payload.get("blocks"))
        except urllib.error.URLError as exc:  # connecting or sending failed: not received
            reason = getattr(exc, "reason", None) or exc.__class__.__name__
            return "failed", self.redact(f"cannot reach Slack ({reason})"), None, True
        except Exception as exc:  # noqa: BLE001 - sent, then no answer: ambiguous
            reason = self.redact(str(exc) or exc.__class__.__name__)
            return "unknown", (f"no answer from Slack after sending ({exc.__class__.__name__}:"
                               f" {reason}); not retried, it may have been posted"), None, False
        if resp.status_code == 200:
            return "ok", None, None, False
        body = self.redact((resp.body or "").strip()[:100])
        error = f"Slack answered HTTP {resp.status_code}" + (f" ({body})" if body else "")
        if resp.status_code == 429:
            return "failed", error, _retry_after(resp.headers), True
        return "failed", error, None, resp.status_code >= 500

    def _resolved_ready(self, item: Any) -> bool | None:
        """For a "resolved" item: True when its "opened" is done, False while it waits,
        None when it was never queued (the resolved message is then skipped)."""
        meta = item.payload.get("meta") or {}
        if meta.get("state") != "resolved" or not meta.get("episode"):
            return True
        status = self.outbox.outbox_status(f"{meta['episode']}|opened")
        if status is None:
            return None
        return status == "done"

    def deliver(self) -> int:
        """Send the messages that are due, oldest first; returns how many were sent.

        Never raises for delivery problems: failures are counted in ``failed_attempts``,
        described in ``last_error``, and the message stays queued for a later call.
        """
        with self._deliver_lock:
            delivered = 0
            for item in self.outbox.outbox_pending(now=time.time()):
                ready = self._resolved_ready(item)
                if ready is None:
                    self.outbox.outbox_mark_sent(
                        item.id, time.time(), note="not sent: its opened message never was")
                    self.outcomes["skipped"] += 1
                    continue
                if not ready:
                    continue  # waits for its "opened" (order per flag)
                if not self._rate_ok(time.time()):
                    break
                stop = False
                for attempt in range(self.max_attempts):
                    result, error, retry_after, retryable = self._post(item.payload)
                    if result == "unknown":
                        now = time.time()
                        self.outbox.outbox_mark_sent(item.id, now, note=error)
                        self._sent_times.append(now)
                        self.outcomes["unknown"] += 1
                        self.last_error = error
                        episode = (item.payload.get("meta") or {}).get("episode", "?")
                        log.warning("Slack: %s (%s)", error, episode)
                        break
                    if result == "ok":
                        now = time.time()
                        self.outbox.outbox_mark_sent(item.id, now)
                        self._sent_times.append(now)
                        self.sent += 1
                        self.outcomes["sent"] += 1
                        delivered += 1
                        self.last_error = None
                        break
                    self.failed_attempts += 1
                    self.last_error = error
                    tries = item.attempts + attempt + 1
                    wait = min(self.retry_base_s * 2**attempt, self.retry_max_s)
                    if retry_after is not None:
                        wait = retry_after
                    last_try = attempt == self.max_attempts - 1
                    if not retryable or last_try or wait > self.retry_max_s:
                        backoff = min(self.retry_base_s * 2**tries, self.backoff_max_s)
                        later = max(backoff, retry_after or 0.0)
                        self.outbox.outbox_mark_failed(item.id, error or "", time.time() + later)
                        # Slack asked us to slow down, or is down: leave the rest for later
                        stop = retry_after is not None or retryable
                        break
                    if self._stop.wait(wait):
                        self.outbox.outbox_mark_failed(item.id, error or "", time.time())
                        return delivered
                if stop:
                    break
            return delivered

    # ------------------------------------------------------------------ background delivery

    def start(self, interval_s: float = 5.0) -> None:
        """Deliver every ``interval_s`` seconds from a daemon thread until ``stop()``."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            logged: set[str] = set()
            while not self._stop.is_set():
                try:
                    self.deliver()
                except Exception as exc:  # noqa: BLE001 - e.g. the store is unavailable
                    self.thread_restarts += 1
                    reason = self.redact(f"{exc.__class__.__name__}: {exc}")
                    self.last_error = f"delivery loop: {reason}"
                    if reason not in logged:
                        logged.add(reason)
                        log.error("Slack delivery failed (%s); trying again in %g s",
                                  reason, interval_s)
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="slack-notifier", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the background thread (messages not yet sent stay in the outbox)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
