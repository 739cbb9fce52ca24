"""The in-memory outbox behaves like the run store's outbox table (same contract)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.notify.outbox import MemoryOutbox
from monitor.store import RunStore


@pytest.fixture(params=["memory", "store"])
def outbox(request, tmp_path: Path):
    if request.param == "memory":
        yield MemoryOutbox()
    else:
        store = RunStore(tmp_path / "run.db")
        yield store
        store.close()


def test_queue_fail_retry_send(outbox) -> None:
    a = outbox.outbox_add({"text": "first"}, dedupe_key="k|opened", created=100.0)
    b = outbox.outbox_add({"text": "second"}, created=101.0)
    assert [i.payload["text"] for i in outbox.outbox_pending()] == ["first", "second"]
    outbox.outbox_mark_failed(a, "HTTP 503", next_attempt=200.0)
    assert [i.id for i in outbox.outbox_pending(now=150.0)] == [b]
    assert [i.id for i in outbox.outbox_pending(now=200.0)] == [a, b]
    outbox.outbox_mark_sent(a, 201.0)
    assert outbox.outbox_count_pending() == 1
    assert [i.id for i in outbox.outbox_pending()] == [b]
    assert outbox.outbox_seen("k|opened", since=100.0)
    assert not outbox.outbox_seen("k|opened", since=100.5)
    assert not outbox.outbox_seen("other", since=0.0)


def test_pending_limit_and_attempts(outbox) -> None:
    ids = [outbox.outbox_add({"n": i}, created=float(i)) for i in range(5)]
    assert [i.id for i in outbox.outbox_pending(limit=2)] == ids[:2]
    outbox.outbox_mark_failed(ids[0], "down", next_attempt=0.0)
    outbox.outbox_mark_failed(ids[0], "still down", next_attempt=0.0)
    first = outbox.outbox_pending()[0]
    assert first.attempts == 2 and first.last_error == "still down"
