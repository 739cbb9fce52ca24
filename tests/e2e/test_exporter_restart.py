"""``verl-monitor exporter`` killed with SIGKILL and started again with the same arguments.

A verl log keeps growing while the exporter is down: console lines without times, rotated by
rename meanwhile; the file logger's JSONL, copy-truncated meanwhile; console lines followed
with ``--log-from-end``. Each run ends with every step once in the store, no resume that never
happened in ``verl-monitor analyze`` of the store's export, nothing booked to restarts in
goodput, one flag row per flag, and one "opened" plus one "resolved" Slack post per flag at a
local webhook that records them.

The log says: a baseline of 12 steps at 1,000 tokens/s, then 700 tokens/s (a 30% drop:
``throughput_regression``, warning), opened before the kill, still true while the exporter is
down and after its restart, resolved when the throughput comes back after it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import WebhookRecorder, wait_until
from test_exporter_process import start

from cli.main import main as cli
from monitor.records import FLAG_KINDS
from monitor.store import RunStore

pytestmark = pytest.mark.e2e

STEP_S = 0.05  # seconds between two step lines (and each step's timer)


def console_line(step: int, throughput: float) -> str:
    return (f"(TaskRunner pid=4021) step:{step} - timing_s/gen:0.030 - timing_s/update_actor:"
            f"0.015 - timing_s/step:{STEP_S:.3f} - perf/throughput:{throughput:.1f} - "
            f"actor/pg_loss:{-0.01 - step * 1e-4:.4f}\n")


def jsonl_line(step: int, throughput: float) -> str:
    return json.dumps({"step": step, "data": {
        "timing_s/gen": 0.03, "timing_s/update_actor": 0.015, "timing_s/step": STEP_S,
        "perf/throughput": throughput, "actor/pg_loss": -0.01 - step * 1e-4}}) + "\n"


class Job:
    """The verl job's log: step lines appended at a steady pace."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path = path
        self.line = jsonl_line if fmt == "jsonl" else console_line
        self.written: list[int] = []

    def steps(self, first: int, last: int, throughput: float) -> None:
        for step in range(first, last + 1):
            with self.path.open("a") as fh:
                fh.write(self.line(step, throughput))
            self.written.append(step)
            time.sleep(STEP_S)


def post_state(body: dict) -> tuple[str, str]:
    """(flag kind, "opened" or "resolved") of one Slack post, read from its header."""
    header = body["blocks"][0]["text"]["text"]
    kind = next((k for k in sorted(FLAG_KINDS, key=len, reverse=True) if k in header), header)
    return kind, "resolved" if "resolved" in header.lower() else "opened"


def posts_by_state(hook: WebhookRecorder) -> dict[str, list[str]]:
    """Slack posts per flag kind: ["opened", "resolved", ...] in the order received."""
    out: dict[str, list[str]] = {}
    for post in hook.snapshot():
        kind, state = post_state(post["body"])
        out.setdefault(kind, []).append(state)
    return out


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def store_value(db: Path, read):
    store = RunStore(db, create=False)
    try:
        return read(store)
    finally:
        store.close()


@pytest.mark.parametrize("fmt, case", [("console", "rename"), ("jsonl", "copytruncate"),
                                       ("console", "from_end")])
def test_killed_and_restarted_every_step_once_one_opened_one_resolved(tmp_path, capsys, fmt,
                                                                      case):
    log = tmp_path / ("train.jsonl" if fmt == "jsonl" else "train.log")
    db = tmp_path / "run.db"
    job = Job(log, fmt)
    if case == "from_end":  # written before the exporter ever ran: never read
        job.steps(1, 3, 1000.0)
        job.written = []
    first = 4 if case == "from_end" else 1
    with WebhookRecorder() as hook:
        url_file = tmp_path / "slack_webhook_url"
        url_file.write_text(f"{hook.url}/services/T0/B0/e2e\n")
        argv = ["--listen-address", "127.0.0.1:0", "--interval", "0.2", "--no-collector.gpu",
                "--no-collector.host", "--no-collector.nccl", "--log", str(log),
                "--store", str(db), "--node", "e2e-node", "--detect-interval", "1",
                "--slack-webhook-file", str(url_file)]
        if case == "from_end":
            argv.append("--log-from-end")
        proc, _ = start(argv, tmp_path)
        try:
            job.steps(first, first + 11, 1000.0)  # the baseline
            job.steps(first + 12, first + 16, 700.0)  # 30% slower: throughput_regression
            hook.wait_for(lambda b: post_state(b) == ("throughput_regression", "opened"),
                          timeout=60, what="the opened post")
            wait_until(lambda: store_value(db, lambda s: s.outbox_count_pending() == 0 and
                                           s.flags(active_only=True)), timeout=30,
                       what="the open flag and the delivered post in the store")
        finally:
            kill9(proc)
        # while the exporter is down: more slow steps, and the log rotated
        job.steps(first + 17, first + 18, 700.0)
        if case == "rename":
            log.rename(log.with_name(log.name + ".1"))
        elif case == "copytruncate":
            log.with_name(log.name + ".1").write_bytes(log.read_bytes())
            with log.open("r+") as fh:
                fh.truncate(0)
        job.steps(first + 19, first + 20, 700.0)
        for name in ("stdout", "stderr"):  # the first run's output, kept
            (tmp_path / f"{name}.txt").rename(tmp_path / f"{name}.1.txt")
        proc, _ = start(argv, tmp_path)
        try:
            last = first + 20
            wait_until(lambda: store_value(db, lambda s: max(
                (st.step for st in s.steps()), default=0) >= last), timeout=30,
                what="the steps written while the exporter was down")
            job.steps(last + 1, last + 6, 1000.0)  # back to normal: the flag resolves
            hook.wait_for(lambda b: post_state(b)[1] == "resolved", timeout=60,
                          what="the resolved post")
            wait_until(lambda: store_value(db, lambda s: max(
                (st.step for st in s.steps()), default=0) >= last + 6), timeout=30,
                what="the last steps")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        for name in ("stderr.1.txt", "stderr.txt"):
            assert "Traceback" not in (tmp_path / name).read_text()
        assert posts_by_state(hook) == {"throughput_regression": ["opened", "resolved"]}

    steps = store_value(db, lambda s: s.steps())
    assert sorted(s.step for s in steps) == job.written  # every step once
    flags = store_value(db, lambda s: s.flags())
    assert [f.kind for f in flags] == ["throughput_regression"] and flags[0].end is not None
    exported = tmp_path / "rec"
    gpu_csv = busy_gpu_csv(tmp_path / "gpu.csv", steps)  # goodput needs GPU time to share
    capsys.readouterr()
    assert cli(["export", str(db), "--out", str(exported)]) == 0
    capsys.readouterr()
    assert cli(["analyze", str(exported / "train.jsonl"), "--gpu", str(gpu_csv), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["steps"]["resumes"] == 0, doc["summary"]["steps"]
    assert doc["summary"]["steps"]["distinct"] == len(job.written)
    assert doc["goodput"]["lost"]["restarts"] == 0.0, doc["goodput"]["lost"]


def busy_gpu_csv(path: Path, steps) -> Path:
    """One GPU busy from before the first step to after the last, every 0.25 s."""
    ends = [s.end_time for s in steps if s.end_time is not None]
    t, stop = min(ends) - 1.0, max(ends) + 1.0
    rows = ["ts,node,gpu,util,sm_active,mem_used_bytes,mem_total_bytes,power_w"]
    while t <= stop:
        rows.append(f"{t:.3f},e2e-node,0,95,60,4e10,8e10,400")
        t += 0.25
    path.write_text("\n".join(rows) + "\n")
    return path
