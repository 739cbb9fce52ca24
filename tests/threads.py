"""A call that must return: run it on a thread and fail the test when it blocks (a FIFO opened
for reading waits for a writer for ever; the test process would hang with it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_thread(fn: Callable[[], Any], within: float = 10.0) -> Any:
    """``fn()``'s result, or AssertionError when it is still running after ``within`` s (the
    thread is a daemon: a blocked call does not keep the test process alive)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), "blocked"
    return out[0]
