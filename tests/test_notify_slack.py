"""SlackNotifier against a real local HTTP server: retries, Retry-After, outbox persistence,
de-duplication, rate limit, and the Block Kit content a person reads."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from monitor.notify.slack import SlackConfigError, SlackNotifier, build_message
from monitor.records import Flag
from monitor.store import RunStore


class Hook:
    """A webhook endpoint on 127.0.0.1: answers with the queued statuses, then 200."""

    def __init__(self) -> None:
        self.statuses: list[tuple[int, dict[str, str]]] = []
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
                self.wfile.write(b"ok" if status == 200 else b"server_error")

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/SECRET"
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
