"""The notifier's outbox when there is no run store: the same methods as ``RunStore``'s
``outbox_*`` methods, kept in memory (lost when the process exits).

Bounded: at most ``max_pending`` messages wait (past it the oldest waiting one is dropped and
counted in ``dropped``), and at most ``max_done`` finished items are remembered for
de-duplication (the oldest are forgotten first)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from monitor.store.runstore import OutboxItem


class MemoryOutbox:
    """An in-memory outbox, thread-safe."""

    def __init__(self, max_pending: int = 1000, max_done: int = 10_000) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self.max_pending = int(max_pending)
        self.max_done = int(max_done)
        #: waiting messages dropped because ``max_pending`` were already waiting
        self.dropped = 0

    def outbox_add(
        self, payload: Mapping[str, Any], *, dedupe_key: str | None = None,
        created: float | None = None,
    ) -> int:
        """Queue a payload; returns its id."""
        with self._lock:
            item_id = self._next_id
            self._next_id += 1
            self._items[item_id] = {
                "created": time.time() if created is None else created,
                "payload": dict(payload), "attempts": 0, "last_error": None, "sent_at": None,
                "next_attempt": 0.0, "dedupe_key": dedupe_key,
            }
            self._bound()
            return item_id

    def _bound(self) -> None:
        pending = [i for i, r in self._items.items() if r["sent_at"] is None]
        for item_id in pending[: max(0, len(pending) - self.max_pending)]:
            del self._items[item_id]
            self.dropped += 1
        done = [i for i, r in self._items.items() if r["sent_at"] is not None]
        for item_id in done[: max(0, len(done) - self.max_done)]:
            del self._items[item_id]

    def outbox_pending(self, now: float | None = None, limit: int = 100) -> list[OutboxItem]:
        """Unsent items due at ``now`` (all unsent when None), oldest first."""
        with self._lock:
            out = [
                OutboxItem(i, r["created"], dict(r["payload"]), r["attempts"], r["last_error"],
                           r["next_attempt"], r["dedupe_key"])
                for i, r in sorted(self._items.items())
                if r["sent_at"] is None and (now is None or r["next_attempt"] <= now)
            ]
        return out[:limit]

    def outbox_count_pending(self) -> int:
        """Number of unsent items."""
        with self._lock:
            return sum(1 for r in self._items.values() if r["sent_at"] is None)

    def outbox_mark_sent(
        self, item_id: int, sent_at: float | None = None, note: str | None = None
    ) -> None:
        """Record that an item is done (delivered, or given up: ``note`` says why)."""
        with self._lock:
            r = self._items.get(item_id)
            if r is None:
                return
            r["sent_at"] = time.time() if sent_at is None else sent_at
            r["attempts"] += 1
            if note is not None:
                r["last_error"] = note
            self._bound()

    def outbox_status(self, dedupe_key: str) -> str | None:
        """"done", "pending" or None (never queued, or forgotten), as ``RunStore``'s."""
        with self._lock:
            states = [r["sent_at"] is not None for r in self._items.values()
                      if r["dedupe_key"] == dedupe_key]
        if not states:
            return None
        return "done" if any(states) else "pending"

    def outbox_mark_failed(self, item_id: int, error: str, next_attempt: float) -> None:
        """Record a failed attempt."""
        with self._lock:
            r = self._items.get(item_id)
            if r is None:
                return
            r["attempts"] += 1
            r["last_error"] = error
            r["next_attempt"] = next_attempt

    def outbox_seen(self, dedupe_key: str, since: float) -> bool:
        """True when an item with this key was queued at or after ``since``."""
        with self._lock:
            return any(
                r["dedupe_key"] == dedupe_key and r["created"] >= since
                for r in self._items.values()
            )
