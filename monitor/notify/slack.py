"""Slack notifications through an incoming webhook, for one machine without Alertmanager.

API::

    notifier = SlackNotifier("~/.slack-webhook", store)   # store: RunStore or None
    notifier.notify_opened(flag)     # queue "flag opened" (returns the outbox id, or None
    notifier.notify_resolved(flag)   #  when filtered by severity or de-duplicated)
    notifier.deliver()               # send what is due; returns how many were sent
    notifier.start(interval_s=5.0)   # or deliver from a background thread; notifier.stop()
    notifier.sent, notifier.failed_attempts, notifier.pending, notifier.last_error
    notifier.failures        # failed attempts by reason (FAILURE_REASONS), for /metrics

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
  every error text goes through :meth:`SlackNotifier.redact` *before* it is cut to length, and
  redaction removes every piece of 8 or more characters of the secret path, however the
  server echoed it (raw, JSON-escaped ``\\/``, percent-encoded).

Every failure is counted and said: ``failures[reason]`` counts failed attempts by reason
(``rejected``: 4xx such as a revoked webhook's 404; ``rate_limited``: 429; ``server_error``:
5xx; ``unreachable``: cannot connect or send), and the log gets one line per reason per
``log_every_s`` (the first at once, then how many more there were), without the URL.

Text from logs is inert: evidence, advice, scope and run name are escaped to Slack's rules
(:func:`slack_escape`: ``&``, ``<``, ``>``), so a log line cannot ping a channel (``<!channel>``),
a user (``<@U123>``) or post a disguised link (``<https://x|Click here>``); only the formatting
this module builds itself (the ``<!date^…>`` times) is markup. Link previews are off.
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
from typing import Any, NamedTuple

from monitor.notify.outbox import MemoryOutbox
from monitor.printable import one_line, printable
from monitor.records import SEVERITIES, Flag

_SEVERITY_ICON = {"info": ":information_source:", "warning": ":warning:",
                  "critical": ":rotating_light:"}
_TEXT_LIMIT = 2900  # Slack caps a section's text at 3,000 characters
_HEADER_LIMIT = 150
#: Characters of an error text or answer body looked at (redacted, then cut much shorter).
_SCAN_LIMIT = 65_536
#: Characters of Slack's answer body kept in an error text (after redaction).
_BODY_LIMIT = 200
#: No piece of the secret path this long survives redaction.
_SECRET_PIECE = 8
#: Slack's webhook secret path (``T…/B…/token``), wherever it shows up: raw, with JSON's
#: escaped slashes or percent-encoded ones.
_SEP = r"(?:/|\\/|%2[Ff])"
_HOOK_PATH = re.compile(rf"(?:https?:{_SEP}{_SEP}[^\s\"'<>]{{0,200}}?)?{_SEP}?services{_SEP}"
                        rf"[A-Za-z0-9_\-]+(?:{_SEP}[A-Za-z0-9_\-]+)*|"
                        rf"\bT[A-Z0-9]{{6,}}{_SEP}B[A-Z0-9]{{6,}}{_SEP}[A-Za-z0-9]{{8,}}")
#: Why an attempt failed, as counted in ``SlackNotifier.failures`` and on /metrics.
FAILURE_REASONS = ("rejected", "rate_limited", "server_error", "unreachable")
#: What each reason means, and what to do, in the exporter's log line.
_FAILURE_HINTS = {
    "rejected": "Slack refused the webhook: a revoked or mistyped webhook answers 403/404; "
                "put a working URL in {file}",
    "rate_limited": "Slack asked to slow down; the queue waits as told",
    "server_error": "Slack had a server error; retrying with backoff",
    "unreachable": "Slack cannot be reached from this node (network, proxy, DNS)",
}
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


def slack_escape(text: str) -> str:
    """``text`` as Slack shows it literally: ``&``, ``<`` and ``>`` as the entities Slack
    asks for, so no mention (``<!channel>``, ``<@U…>``), link (``<url|text>``) or date can come
    from it; terminal escapes, bidirectional overrides and other invisible characters shown
    as backslash escapes (``monitor.printable``)."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip_escaped(text: str, limit: int) -> str:
    """Escaped text cut to ``limit`` without leaving half an entity (``&am``) at the end."""
    if len(text) <= limit:
        return text
    return re.sub(r"&[a-z]*$", "", text[: limit - 1]) + "…"


def _inert(text: str, limit: int) -> str:
    return _clip_escaped(slack_escape(text), limit)


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
        {"type": "mrkdwn", "text": f"*Scope*\n{_inert(scope, 500)}"},
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
            "type": "mrkdwn", "text": "*Evidence*\n" + _inert(flag.evidence, _TEXT_LIMIT)}})
    if flag.advice and state != "resolved":
        bullets = "\n".join(f"• {a}" for a in flag.advice)
        blocks.append({"type": "section", "text": {
            "type": "mrkdwn", "text": "*Advice*\n" + _inert(bullets, _TEXT_LIMIT)}})
    context = "verl-monitor" + (f" · run {slack_escape(run)}" if run else "")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {
        "text": _inert(text, _TEXT_LIMIT),
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


def _secret_pieces(url: str) -> frozenset[str]:
    """Every run of ``_SECRET_PIECE`` characters (lower case) of the parts of the webhook's path
    and query: what must never show, however the separators between them were echoed."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    words = re.split(r"[/?&=;,]+", unquote(parts.path + "?" + parts.query))
    pieces = set()
    for word in words:
        if word.lower() == "services":  # Slack's fixed word, not the secret
            continue
        word = word.lower()
        pieces.update(word[i:i + _SECRET_PIECE] for i in range(len(word) - _SECRET_PIECE + 1))
    return frozenset(pieces)


def _mask_pieces(text: str, pieces: frozenset[str]) -> str:
    """``text`` with each stretch made of secret pieces replaced by ``<webhook>``."""
    n = _SECRET_PIECE
    if not pieces or len(text) < n:
        return text
    spans: list[list[int]] = []
    for i in range(len(text) - n + 1):
        if text[i:i + n].lower() in pieces:
            if spans and i <= spans[-1][1]:
                spans[-1][1] = i + n
            else:
                spans.append([i, i + n])
    if not spans:
        return text
    out, at = [], 0
    for lo, hi in spans:
        out += [text[at:lo], "<webhook>"]
        at = hi
    return "".join(out) + text[at:]


class _Answer(NamedTuple):
    """What one POST came to. result: "ok"; "failed" (Slack did not take it: retried per
    ``retryable``); "unknown" (the body went out and no answer came: it may be posted, so it
    is not retried). ``reason``: one of FAILURE_REASONS for a failure."""

    result: str
    error: str | None
    retry_after: float | None
    retryable: bool
    reason: str | None


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
        log_every_s: float = 300.0,
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
        #: failed attempts by reason (every reason present from the start)
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        #: messages waiting, as of the last queueing or delivery (read without the store);
        #: from the start, those a restart found in the store's outbox
        try:
            self.pending_seen = self.outbox.outbox_count_pending()
        except Exception:  # noqa: BLE001 - an unreadable store shows at the first delivery
            self.pending_seen = 0
        self.log_every_s = float(log_every_s)
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}
        self._failing = 0
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
        self._secret_pieces = _secret_pieces(self._url)

    def __repr__(self) -> str:  # never show the URL
        return f"SlackNotifier(webhook_url_file={self.webhook_url_file!r}, pending={self.pending})"

    def redact(self, text: str) -> str:
        """``text`` without the webhook URL or any piece of its secret path of 8 or more
        characters (a server may echo them, escaped or encoded). Redact first, then cut."""
        from urllib.parse import urlsplit

        path = urlsplit(self._url).path
        for secret in (self._url, path, path.lstrip("/")):
            if len(secret) > _SECRET_PIECE:
                text = text.replace(secret, "<webhook>")
        return _mask_pieces(_HOOK_PATH.sub("<webhook>", text), self._secret_pieces)

    def excerpt(self, text: str, limit: int) -> str:
        """At most ``limit`` characters of ``text`` on one printable line (newlines and control
        characters escaped: an answer body cannot forge log lines), redacted before it is cut."""
        return one_line(self.redact(str(text)[:_SCAN_LIMIT]).strip(), limit)

    @property
    def dropped(self) -> int:
        """Messages the in-memory outbox dropped at its bound (0 with a store)."""
        return int(getattr(self.outbox, "dropped", 0) or 0)

    # ------------------------------------------------------------------ queueing

    @property
    def pending(self) -> int:
        """Messages waiting in the outbox (and ``pending_seen`` updated)."""
        self.pending_seen = self.outbox.outbox_count_pending()
        return self.pending_seen

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
        item = self.outbox.outbox_add(payload, dedupe_key=key, created=now)
        self.pending_seen += 1
        return item

    def notify_opened(self, flag: Flag) -> int | None:
        """Queue a "flag opened" message; None when filtered out or a duplicate."""
        return self._enqueue(flag, "opened")

    def notify_digest(self, payload: dict[str, Any], key: str) -> int | None:
        """Queue a message that is not a flag's (the goodput digest), once per ``key``."""
        dedupe = f"digest|{key}"
        if self.outbox.outbox_status(dedupe) is not None:
            return None
        item = self.outbox.outbox_add(payload, dedupe_key=dedupe, created=time.time())
        self.pending_seen += 1
        return item

    def notify_resolved(self, flag: Flag) -> int | None:
        """Queue a "flag resolved" message (shows the duration); None when filtered/duplicate."""
        return self._enqueue(flag, "resolved")

    # ------------------------------------------------------------------ delivering

    def _rate_ok(self, now: float) -> bool:
        while self._sent_times and now - self._sent_times[0] >= 60.0:
            self._sent_times.popleft()
        return len(self._sent_times) < self.rate_limit_per_min

    def _post(self, payload: dict[str, Any]) -> _Answer:
        """One POST and what came of it (see :class:`_Answer`)."""
        try:
            resp = self._client.send(text=payload.get("text"), blocks=payload.get("blocks"),
                                     unfurl_links=False, unfurl_media=False)
        except urllib.error.URLError as exc:  # connecting or sending failed: not received
            reason = getattr(exc, "reason", None) or exc.__class__.__name__
            return _Answer("failed", "cannot reach Slack (" + self.excerpt(reason, _BODY_LIMIT)
                           + ")", None, True, "unreachable")
        except Exception as exc:  # noqa: BLE001 - sent, then no answer: ambiguous
            reason = self.excerpt(str(exc) or exc.__class__.__name__, _BODY_LIMIT)
            return _Answer("unknown", (f"no answer from Slack after sending "
                                       f"({exc.__class__.__name__}: {reason}); not retried, "
                                       "it may have been posted"), None, False, None)
        status = resp.status_code
        if status == 200:
            return _Answer("ok", None, None, False, None)
        body = self.excerpt(resp.body or "", _BODY_LIMIT)
        error = f"Slack answered HTTP {status}" + (f" ({body})" if body else "")
        if status == 429:
            return _Answer("failed", error, _retry_after(resp.headers), True, "rate_limited")
        if status >= 500:
            return _Answer("failed", error, None, True, "server_error")
        return _Answer("failed", error, None, False, "rejected")

    def _failed(self, reason: str, error: str) -> None:
        """Count a failed attempt; say it in the log at most once per reason per
        ``log_every_s`` (the first at once, later lines with how many came between)."""
        self.failed_attempts += 1
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_error = error
        self._failing += 1
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now = time.monotonic()
        last = self._logged_at.get(reason)
        if last is not None and now - last < self.log_every_s:
            return
        count = self._unlogged.pop(reason)
        self._logged_at[reason] = now
        hint = _FAILURE_HINTS.get(reason, "").format(file=self.webhook_url_file)
        more = f"; {count} failed attempts ({reason}) since the last line" if count > 1 else ""
        log.warning("Slack delivery failed: %s. %s; the message stays queued (%s)%s",
                    error, hint, "verlmon_slack_failed_attempts_total", more)

    def _delivered(self) -> None:
        if self._failing:
            log.info("Slack: delivering again after %d failed attempts", self._failing)
            self._failing = 0
            self._logged_at.clear()
            self._unlogged.clear()

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

        Never raises for delivery problems: failures are counted in ``failed_attempts`` and
        ``failures[reason]``, described in ``last_error`` and the log (rate-limited), and the
        message stays queued for a later call.
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
                    answer = self._post(item.payload)
                    result, error, retry_after, retryable = answer[:4]
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
                        self._delivered()
                        break
                    self._failed(answer.reason or "rejected", error or "")
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
            self.pending_seen = self.outbox.outbox_count_pending()
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
                    reason = self.excerpt(f"{exc.__class__.__name__}: {exc}", 300)
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
