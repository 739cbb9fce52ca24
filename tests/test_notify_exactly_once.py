"""Slack exactly once per flag episode (issue 12, items 2 and 14), against a real local
webhook endpoint: every episode gets its message, none twice (not after a restart, not after a
timeout), "resolved" only after "opened", and the webhook's secret path never stored."""

from __future__ import annotations

import http.server
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from monitor.notify.outbox import MemoryOutbox
from monitor.notify.slack import SlackNotifier
from monitor.records import Flag
from monitor.store import RunStore

SECRET_PATH = "/services/T0AAAAAAA/B0BBBBBBB/s3cretT0kenValue"


class Hook:
    """A webhook on 127.0.0.1: answers with queued (status, delay_s, body), then 200."""

    def __init__(self) -> None:
        self.plan: list[tuple[int, float, bytes]] = []
        self.requests: list[dict] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.requests.append(body)
                status, delay, answer = hook.plan.pop(0) if hook.plan else (200, 0.0, b"ok")
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the client gave up waiting

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{SECRET_PATH}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def texts(self) -> list[str]:
        return [r["text"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def notifier(tmp_path: Path, hook: Hook, store=None, **kw) -> SlackNotifier:
    p = tmp_path / "webhook"
    p.write_text(hook.url + "\n")
    return SlackNotifier(str(p), store, retry_base_s=0.01, **kw)


def oom(start: float, end: float | None = None) -> Flag:
    return Flag(kind="oom", severity="critical", start=start, end=end, scope={},
                evidence="CUDA out of memory")


def test_two_ooms_85_s_apart_are_two_messages(tmp_path, hook):
    """Before: the key kind|scope|state (empty scope for oom) swallowed the second OOM."""
    n = notifier(tmp_path, hook)
    assert n.notify_opened(oom(1000.0)) is not None
    assert n.notify_opened(oom(1085.0)) is not None
    assert n.deliver() == 2 and len(hook.requests) == 2


def test_an_episode_is_announced_once_even_after_a_restart(tmp_path, hook):
    store = RunStore(tmp_path / "run.db")
    n = notifier(tmp_path, hook, store)
    n.notify_opened(oom(1000.0))
    assert n.deliver() == 1
    store.close()
    store = RunStore(tmp_path / "run.db")  # the exporter restarts and sees the flag again
    again = notifier(tmp_path, hook, store)
    assert again.notify_opened(oom(1000.0)) is None
    assert again.deliver() == 0 and len(hook.requests) == 1
    store.close()


def test_resolved_waits_for_opened_after_an_outage(tmp_path, hook):
    """Before: "resolved" (due at once) went out before the "opened" still in backoff."""
    hook.plan = [(500, 0.0, b"down")] * 2
    n = notifier(tmp_path, hook, None, max_attempts=2)
    n.notify_opened(oom(1000.0))
    assert n.deliver() == 0  # Slack down: "opened" scheduled for later
    n.notify_resolved(oom(1000.0, end=1100.0))
    assert n.deliver() == 0 and len(hook.requests) == 2  # "resolved" did not jump ahead
    item = n.outbox.outbox_pending()[0]
    n.outbox.outbox_mark_failed(item.id, "due now", next_attempt=0.0)
    assert n.deliver() == 2
    assert [t.split("]")[1].strip()[:8] for t in hook.texts()[2:]] == ["oom — wh", "resolved"]


def test_resolved_without_opened_is_not_sent(tmp_path, hook):
    n = notifier(tmp_path, hook)
    n.notify_resolved(oom(1000.0, end=1100.0))
    assert n.deliver() == 0 and hook.requests == []
    assert n.outcomes["skipped"] == 1 and n.pending == 0


@pytest.mark.slow
def test_a_slow_answer_never_causes_a_second_post(tmp_path, hook, caplog):
    """Before: answers after the 5 s timeout were retried: the same body up to 10 times."""
    hook.plan = [(200, 2.5, b"ok")]
    n = notifier(tmp_path, hook, None, timeout_s=1.0, max_attempts=3)
    n.notify_opened(oom(1000.0))
    with caplog.at_level(logging.WARNING, logger="verl_monitor.notify"):
        assert n.deliver() == 0
        for _ in range(3):
            n.deliver()
    time.sleep(2.0)  # the slow answer lands
    assert len(hook.requests) == 1
    assert n.outcomes == {"sent": 0, "unknown": 1, "skipped": 0} and n.pending == 0
    assert [r.getMessage() for r in caplog.records if "may have been posted" in r.getMessage()]


def test_the_webhook_path_never_reaches_the_store_or_the_log(tmp_path, hook, caplog):
    """Before: an error body echoing the request path was kept in outbox.last_error."""
    hook.plan = [(404, 0.0, f"no_service: POST {SECRET_PATH} unknown".encode())]
    store = RunStore(tmp_path / "run.db")
    n = notifier(tmp_path, hook, store)
    n.notify_opened(oom(1000.0))
    with caplog.at_level(logging.DEBUG):
        n.deliver()
    store.close()
    assert "HTTP 404" in n.last_error and "<webhook>" in n.last_error
    with sqlite3.connect(tmp_path / "run.db") as db:
        dump = "\n".join(db.iterdump())
    for secret in ("s3cretT0kenValue", "T0AAAAAAA/B0BBBBBBB"):
        assert secret not in dump and secret not in n.last_error
        assert secret not in caplog.text


def test_the_memory_outbox_is_bounded_and_counts_drops():
    box = MemoryOutbox(max_pending=3, max_done=2)
    ids = [box.outbox_add({"text": str(i)}, dedupe_key=f"k{i}") for i in range(5)]
    assert box.dropped == 2 and [i.payload["text"] for i in box.outbox_pending()] == ["2", "3",
                                                                                       "4"]
    for i in ids[2:]:
        box.outbox_mark_sent(i)
    assert box.outbox_status("k2") is None and box.outbox_status("k4") == "done"
