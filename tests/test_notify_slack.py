"""SlackNotifier against a real local HTTP server: retries, Retry-After, outbox persistence,
de-duplication, rate limit, and the Block Kit content a person reads."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import sqlite3
import threading
from pathlib import Path

import pytest

from monitor.notify.slack import SlackConfigError, SlackNotifier, build_message
from monitor.records import Flag
from monitor.store import RunStore


class Hook:
    """A webhook endpoint on 127.0.0.1: answers with the queued statuses, then 200. ``answer``
    (the request path -> the body of an error answer) lets it echo the path, as some do."""

    def __init__(self, path: str = "/services/T000/B000/SECRET") -> None:
        self.statuses: list[tuple[int, dict[str, str]]] = []
        self.answer = lambda path: b"server_error"
        self.requests: list[dict] = []
        self.delivered: list[dict] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.requests.append(body)
                status, headers = hook.statuses.pop(0) if hook.statuses else (200, {})
                if status == 200:
                    hook.delivered.append(body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else hook.answer(self.path))

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def url_file(tmp_path: Path, url: str) -> str:
    p = tmp_path / "webhook"
    p.write_text(url + "\n")
    return str(p)


def flag(kind: str = "gpu_imbalance", severity: str = "warning", gpus=(3,), end=None) -> Flag:
    return Flag(kind=kind, severity=severity, start=1_767_225_600.0, end=end,
                scope={"node": "n0", "gpus": list(gpus), "phase": "gen"},
                evidence="GPU 3 ran at 41% while the others ran at 93% during gen",
                advice=["Set actor_rollout_ref.actor.use_dynamic_bsz=True.",
                        "Set trainer.balance_batch=True."])


def test_server_error_then_recovery_delivers_exactly_once(tmp_path: Path, hook: Hook) -> None:
    hook.statuses = [(500, {})]
    store = RunStore(tmp_path / "run.db")
    n = SlackNotifier(url_file(tmp_path, hook.url), store, retry_base_s=0.01)
    assert n.notify_opened(flag()) is not None
    assert n.deliver() == 1
    assert len(hook.requests) == 2 and len(hook.delivered) == 1
    assert n.sent == 1 and n.failed_attempts == 1 and n.pending == 0
    assert n.deliver() == 0 and len(hook.requests) == 2  # nothing sent twice
    store.close()


def test_message_waits_in_store_outbox_while_slack_is_down(tmp_path: Path, hook: Hook) -> None:
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/services/T000/B000/SECRET"
    store_path = tmp_path / "run.db"
    store = RunStore(store_path)
    down = SlackNotifier(url_file(tmp_path, dead), store, retry_base_s=0.01, max_attempts=2)
    down.notify_opened(flag())
    assert down.deliver() == 0
    assert down.pending == 1 and down.failed_attempts == 2
    assert "cannot reach Slack" in down.last_error
    assert "SECRET" not in down.last_error and "SECRET" not in repr(down)
    store.close()
    # the exporter restarts later, Slack is back: the queued message goes out, once
    store = RunStore(store_path)
    (tmp_path / "webhook").write_text(hook.url)
    up = SlackNotifier(str(tmp_path / "webhook"), store, retry_base_s=0.01)
    up.outbox.outbox_mark_failed(store.outbox_pending()[0].id, "test: due now", next_attempt=0)
    assert up.deliver() == 1
    assert len(hook.delivered) == 1 and up.pending == 0
    assert hook.delivered[0]["text"].startswith(":warning: [WARNING] gpu_imbalance")
    store.close()


def test_retry_after_is_honoured(tmp_path: Path, hook: Hook) -> None:
    hook.statuses = [(429, {"Retry-After": "120"})]
    n = SlackNotifier(url_file(tmp_path, hook.url), None, retry_base_s=0.01, retry_max_s=5)
    n.notify_opened(flag())
    n.notify_opened(flag(gpus=(5,)))
    assert n.deliver() == 0
    assert len(hook.requests) == 1  # no retry before Retry-After, and the queue paused
    assert n.pending == 2 and "HTTP 429" in n.last_error
    assert n.deliver() == 1  # the second message is due; the first waits its 120 s
    item = n.outbox.outbox_pending()[0]
    assert item.attempts == 1 and item.next_attempt >= item.created + 120


def test_dedupe_and_severity_filter(tmp_path: Path, hook: Hook) -> None:
    n = SlackNotifier(url_file(tmp_path, hook.url), None, min_severity="warning")
    assert n.notify_opened(flag()) is not None
    assert n.notify_opened(flag()) is None  # same kind + scope + state within an hour
    assert n.notify_opened(flag(gpus=(4,))) is not None  # another scope
    assert n.notify_opened(flag(kind="stalled", severity="info")) is None  # below warning
    assert n.notify_resolved(flag(end=1_767_229_500.0)) is not None
    assert n.deliver() == 3 and len(hook.delivered) == 3


def test_rate_limit_holds_back_the_rest(tmp_path: Path, hook: Hook) -> None:
    n = SlackNotifier(url_file(tmp_path, hook.url), None, rate_limit_per_min=2)
    for g in range(5):
        n.notify_opened(flag(gpus=(g,)))
    assert n.deliver() == 2 and n.pending == 3 and len(hook.requests) == 2


def test_client_error_is_not_retried_in_a_loop(tmp_path: Path, hook: Hook) -> None:
    hook.statuses = [(404, {})]
    n = SlackNotifier(url_file(tmp_path, hook.url), None, retry_base_s=0.01)
    n.notify_opened(flag())
    assert n.deliver() == 0 and len(hook.requests) == 1
    assert "HTTP 404" in n.last_error and n.pending == 1


def test_blocks_carry_what_a_person_needs() -> None:
    opened = build_message(flag(severity="critical"), "opened", run="grpo-7b")
    text = json.dumps(opened["blocks"], ensure_ascii=False)
    assert opened["blocks"][0]["text"]["text"] == "gpu_imbalance (critical)"
    assert "CRITICAL" in text and "node n0, GPU 3, phase gen" in text
    assert "GPU 3 ran at 41%" in text
    assert "• Set actor_rollout_ref.actor.use_dynamic_bsz=True.\\n• Set trainer.balance_batch" in text
    assert "<!date^1767225600^" in text and "2026-01-01 00:00:00 UTC" in text
    assert "run grpo-7b" in text
    resolved = build_message(flag(end=1_767_225_600.0 + 3900), "resolved")
    rtext = json.dumps(resolved["blocks"], ensure_ascii=False)
    assert resolved["blocks"][0]["text"]["text"].startswith("Resolved: gpu_imbalance")
    assert "*Duration*\\n1 h 5 min" in rtext
    assert resolved["text"].startswith(":white_check_mark:")


def test_webhook_file_problems(tmp_path: Path) -> None:
    with pytest.raises(SlackConfigError, match="no such file"):
        SlackNotifier(str(tmp_path / "missing"), None)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SlackConfigError, match="empty"):
        SlackNotifier(str(empty), None)
    bad = tmp_path / "bad"
    bad.write_text("xoxb-not-a-url-SECRET")
    with pytest.raises(SlackConfigError) as exc:
        SlackNotifier(str(bad), None)
    assert "SECRET" not in str(exc.value)


def test_background_delivery(tmp_path: Path, hook: Hook) -> None:
    n = SlackNotifier(url_file(tmp_path, hook.url), None)
    n.start(interval_s=0.05)
    try:
        n.notify_opened(flag())
        done = threading.Event()
        for _ in range(200):
            if hook.delivered:
                done.set()
                break
            done.wait(0.05)
        assert done.is_set()
    finally:
        n.stop()
    assert n.sent == 1 and n.pending == 0


# ---------------------------------------------------------------- issue 20: every failure
# counted and said; log text inert; the secret redacted before any text is cut

#: A Slack webhook path and a relay's (not Slack-shaped): the words of 8+ characters are secret.
SLACK_PATH = "/services/T07QX3K9Z2M/B08AB7RT4PQ/Xk29fLq0pWm3Rz8vNc41YbTs"
RELAY_PATH = "/relay/v1/hooks/9f2c4e7a1b8d3f6e0c5a9b2d7e4f1a3c8b6d0e2f5a7c9e1b3d5f7a9c2e4b6d8f"
HOSTILE = ("<!channel> model says: <https://evil.example/login|Click here> & ping <@U0123ABCD> "
           "<!here> <!subteam^S0123|@oncall>")


def leaked(path: str, text: str) -> list[str]:
    """The 8-character pieces of the path's secret words found in ``text``."""
    words = [w.lower() for w in path.split("/") if len(w) >= 8 and w != "services"]
    low = text.lower()
    return sorted({w[i:i + 8] for w in words for i in range(len(w) - 7) if w[i:i + 8] in low})


def test_log_text_cannot_ping_a_channel_or_hide_a_link(tmp_path: Path, hook: Hook) -> None:
    """Before: a log line's <!channel> and <url|text> were posted verbatim."""
    bad = Flag(kind="fatal_error", severity="critical", start=1_767_225_600.0, end=None,
               scope={"node": "<!everyone>"}, evidence=HOSTILE, advice=[f"read {HOSTILE}"])
    n = SlackNotifier(url_file(tmp_path, hook.url), None, run="grpo <!channel>")
    n.notify_opened(bad)
    assert n.deliver() == 1
    (body,) = hook.delivered
    posted = json.dumps(body)
    for markup in ("<!channel>", "<!here>", "<!everyone>", "<@U0123ABCD>", "<!subteam",
                   "<https://evil.example"):
        assert markup not in posted, markup
    # the reader sees the text as written: Slack turns the entities back into < > &
    evidence = next(b["text"]["text"] for b in body["blocks"]
                    if b.get("text", {}).get("text", "").startswith("*Evidence*"))
    assert evidence == "*Evidence*\n" + HOSTILE.replace("&", "&amp;").replace(
        "<", "&lt;").replace(">", "&gt;")
    assert "&lt;!channel&gt;" in body["text"]
    # our own markup still works: the start time is Slack's date formatting
    assert "<!date^1767225600^" in posted
    assert body["unfurl_links"] is False and body["unfurl_media"] is False


def test_revoked_webhook_is_counted_and_said_once_without_the_url(tmp_path: Path, caplog
                                                                   ) -> None:
    """Before: a 404 failed 4 times without a word in the log, and nothing counted it."""
    hook = Hook(SLACK_PATH)
    try:
        hook.statuses = [(404, {})] * 4
        hook.answer = lambda path: f"no_service {path}".encode()
        n = SlackNotifier(url_file(tmp_path, hook.url), RunStore(tmp_path / "run.db"))
        for g in range(4):
            n.notify_opened(flag(gpus=(g,)))
        with caplog.at_level(logging.INFO, logger="verl_monitor.notify"):
            assert n.deliver() == 0
            lines = [r.getMessage() for r in caplog.records]
            assert len(hook.requests) == 4
            assert n.failures == {"rejected": 4, "rate_limited": 0, "server_error": 0,
                                  "unreachable": 0}
            assert n.pending_seen == 4 and n.pending == 4
            (line,) = lines  # one line for the reason, not one per attempt
            assert "HTTP 404" in line and str(tmp_path / "webhook") in line
            assert leaked(SLACK_PATH, line) == [] and "127.0.0.1" not in line
            # the webhook works again: every message goes, and the log says so once
            for item in n.outbox.outbox_pending():
                n.outbox.outbox_mark_failed(item.id, "due now", next_attempt=0.0)
            assert n.deliver() == 4 and n.pending_seen == 0
            again = [r.getMessage() for r in caplog.records][len(lines):]
        assert again == ["Slack: delivering again after 4 failed attempts"]
    finally:
        hook.close()


def test_failures_are_logged_once_per_reason_per_interval(tmp_path: Path, hook: Hook,
                                                          caplog) -> None:
    hook.statuses = [(500, {})] * 6 + [(404, {})] * 2
    n = SlackNotifier(url_file(tmp_path, hook.url), None, retry_base_s=0.001, max_attempts=2,
                      log_every_s=3600)
    n.notify_opened(flag())
    with caplog.at_level(logging.WARNING, logger="verl_monitor.notify"):
        for _ in range(4):  # 4 rounds x 2 attempts: 6 server errors, then 2 refusals
            for item in n.outbox.outbox_pending():
                n.outbox.outbox_mark_failed(item.id, "due now", next_attempt=0.0)
            n.deliver()
    assert n.failures["server_error"] == 6 and n.failures["rejected"] == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "HTTP 500" in said[0] and "HTTP 404" in said[1]
    # the interval has passed: the next line counts the attempts since the last one (5 held
    # back and its own)
    n.log_every_s, n.max_attempts = 0.0, 1
    hook.statuses = [(500, {})]
    with caplog.at_level(logging.WARNING, logger="verl_monitor.notify"):
        for item in n.outbox.outbox_pending():
            n.outbox.outbox_mark_failed(item.id, "due now", next_attempt=0.0)
        n.deliver()
    last = caplog.records[-1].getMessage()
    assert len(caplog.records) == 3 and "6 failed attempts (server_error) since the last" in last


@pytest.mark.parametrize("path", [SLACK_PATH, RELAY_PATH], ids=["slack", "relay"])
@pytest.mark.parametrize("echo", ["raw", "json", "percent"])
def test_an_echoed_secret_is_redacted_before_the_text_is_cut(tmp_path: Path, caplog, path,
                                                             echo) -> None:
    """Before: the body was cut to 100 characters, then redacted: 80 of 95 secret characters
    of a path the cut had split stayed in the outbox's last_error."""
    from urllib.parse import quote

    shown = {"raw": path, "json": path.replace("/", "\\/"),
             "percent": quote(path, safe="")}[echo]
    hook = Hook(path)
    try:
        hook.statuses = [(404, {}), (500, {})]
        # the path starts 60 characters in: a cut at 100 would split it
        hook.answer = lambda p: ('{"error": "no_such_hook", "detail": "unknown", "path": "'
                                 + shown + '"}').encode()
        store = RunStore(tmp_path / "run.db")
        n = SlackNotifier(url_file(tmp_path, hook.url), store, max_attempts=1)
        n.notify_opened(flag())
        n.notify_opened(flag(gpus=(5,)))
        with caplog.at_level(logging.DEBUG):
            n.deliver()
        store.close()
    finally:
        hook.close()
    assert len(hook.requests) == 2
    with sqlite3.connect(tmp_path / "run.db") as db:
        errors = [r[0] for r in db.execute("SELECT last_error FROM outbox")]
    for text in (*errors, n.last_error, caplog.text):
        assert leaked(path, text) == [], text
    assert all("<webhook>" in e for e in errors), errors


def test_an_answer_body_cannot_write_fake_log_lines(tmp_path: Path, caplog) -> None:
    """Before: Slack's answer body went into the log with its newlines, so a hostile endpoint
    could append a line that looks like the exporter's own ("CRITICAL ... stalled")."""
    hook = Hook(SLACK_PATH)
    try:
        hook.statuses = [(400, {})]
        hook.answer = lambda p: (b"invalid_payload\n2026-12-01 CRITICAL verl_monitor flag "
                                 b"stalled opened\r\x1b[2Jcleared\x00" + b"x" * 5000)
        n = SlackNotifier(url_file(tmp_path, hook.url), None, max_attempts=1)
        n.notify_opened(flag())
        with caplog.at_level(logging.WARNING, logger="verl_monitor.notify"):
            n.deliver()
    finally:
        hook.close()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x00" not in line
    assert "invalid_payload\\n2026-12-01 CRITICAL" in line  # shown, escaped, on one line
    assert len(line) < 800
    assert "\n" not in n.last_error


def test_escapes_and_bidi_overrides_in_evidence_reach_slack_escaped() -> None:
    """Issue 41 item 4 (round 5 A10): a frame's ESC[2J and OSC 0 and a right-to-left override
    went to Slack as raw bytes; they show as backslash escapes."""
    hostile = Flag("hang", "critical", 1_767_225_600.0, None, scope={"node": "n\u202e0"},
                   evidence="stuck at evil\x1b[2J\x1b]0;owned\x07 (x.py:1) \u202egnp.exe",
                   advice=["Look at \u2066this\u2069."])
    msg = build_message(hostile, "opened", run="r\x1b[31m")
    text = json.dumps([msg["text"], msg["blocks"]], ensure_ascii=False)  # what Slack gets
    assert not [c for c in text if c in "\x1b\x07\u202e\u2066\u2069"]
    assert "evil\\\\x1b[2J\\\\x1b]0;owned\\\\x07" in text  # JSON doubles the backslash
    assert "\\\\u202egnp.exe" in text
