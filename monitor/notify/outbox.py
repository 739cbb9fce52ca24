"""The notifier's outbox when there is no run store: the same methods as ``RunStore``'s
``outbox_*`` methods, kept in memory (lost when the process exits)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from monitor.store.runstore import OutboxItem


class MemoryOutbox:
    """An in-memory outbox, thread-safe."""

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._next_id = 1
        self._lock = threading.Lock()

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
            return item_id

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

    def outbox_mark_sent(self, item_id: int, sent_at: float | None = None) -> None:
        """Record a successful delivery."""
        with self._lock:
            r = self._items[item_id]
            r["sent_at"] = time.time() if sent_at is None else sent_at
            r["attempts"] += 1

    def outbox_mark_failed(self, item_id: int, error: str, next_attempt: float) -> None:
        """Record a failed attempt."""
        with self._lock:
            r = self._items[item_id]
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
