"""Hangs named at real time (issue 29): the real exporter follows a real job's log and says who
is stuck and where, at the shipped settings (1 s sampling, 30 s detector interval).

The job is the verl-shaped stand-in of tests/hang_standins.py: real Python processes with Ray
titles (``ray::TaskRunner.run``, ``ray::WorkerDict.<method>``) and Ray log prefixes
(``(TaskRunner pid=N) step:...``), running in files laid out as verl's. Each case logs a few
healthy steps, then gets stuck (or runs a long healthy phase). The exporter is given only
``--log`` (no --fr-dir, no --hang-pyspy: py-spy is on by default). Measured: the seconds from
the last step line to the ``hang`` flag in the exporter's /metrics, the process and frame the
flag names, and its first line of advice.

    python3 bench/hang_where.py [--out bench/results/hang_where_DATE_devbox.txt]
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import hang_standins as hs  # noqa: E402

#: (name, driver case, step seconds, worker mode or None, pause for healthy phases, quiet)
CASES = [
    ("reward hangs (compute_score loop)", "reward", 20.0, "idle", 0.0, False),
    ("reward blocks on HTTP (server never answers)", "http", 20.0, "idle", 0.0, False),
    ("data loader blocks (dataset __getitem__)", "data", 20.0, None, 0.0, False),
    ("data loader worker process blocks (forked from the driver)", "data_mp", 20.0, None, 0.0,
     False),
    ("worker method never returns", "worker", 20.0, "busy", 0.0, False),
    ("reward hangs, 60 s steps", "reward", 60.0, "idle", 0.0, False),
    ("healthy long validation (150 s, workers generating)", "validate", 20.0, "gen", 150.0, True),
    ("healthy long checkpoint (150 s)", "ckpt", 20.0, None, 150.0, True),
]
STEPS = 4
_SERVING = re.compile(r"serving (http://\S+/metrics)")


def _start_exporter(log: Path, store: Path) -> tuple[subprocess.Popen, str]:
    out = log.with_suffix(".exporter.log")
    fh = open(out, "w")  # noqa: SIM115 - kept open for the exporter's life
    p = subprocess.Popen([sys.executable, "-m", "monitor", "exporter", "--log", str(log),
                          "--listen-address", "127.0.0.1:0", "--node", "devbox",
                          "--no-collector.gpu", "--store", str(store)],
                         stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = _SERVING.search(out.read_text())
        if m:
            return p, m.group(1)
        time.sleep(0.2)
    raise RuntimeError(f"exporter did not start: {out.read_text()[-500:]}")


def _hang_active(url: str) -> bool:
    import httpx

    try:
        text = httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return False
    return any(line.startswith("verlmon_flag_active{") and 'kind="hang"' in line
               and line.rstrip().endswith(" 1.0") for line in text.splitlines())


class Case:
    """One case: its job, workers, exporter and what was seen."""

    def __init__(self, spec: tuple, base: Path) -> None:
        self.name, self.case, self.step_s, self.worker, self.pause, self.quiet = spec
        self.dir = Path(tempfile.mkdtemp(prefix=f"hw_{self.case}_", dir=base))
        self.root = hs.write_job_tree(self.dir / "job")
        self.log = self.dir / "train.log"
        self.log.write_text("")
        self.procs: list[subprocess.Popen] = []
        self.server: socket.socket | None = None
        self.last_step_t: float | None = None
        self.steps_seen = 0
        self.flag_t: float | None = None
        self.steps_after = 0

    def start(self) -> None:
        self.exporter, self.url = _start_exporter(self.log, self.dir / "run.db")
        url = ""
        if self.case == "http":
            self.server = socket.socket()
            self.server.bind(("127.0.0.1", 0))
            self.server.listen(8)
            url = f"http://127.0.0.1:{self.server.getsockname()[1]}/score"
        if self.worker:
            title = "ray::WorkerDict" if self.worker == "idle" else \
                "ray::WorkerDict.actor_rollout_generate_sequences"
            self.procs.append(hs.start_worker(self.root, self.log, busy=self.worker, title=title))
        self.procs.insert(0, hs.start_job(self.root, self.case, self.log, steps=STEPS,
                                          step_s=self.step_s, url=url, pause_s=self.pause))

    def poll(self) -> bool:
        """Note new step lines and the flag; True while the case should go on."""
        n = self.log.read_text().count(") step:")
        now = time.time()
        if n != self.steps_seen:
            self.steps_seen = n
            if self.flag_t is None and n <= STEPS:
                self.last_step_t = now
            elif n > STEPS:
                self.steps_after = n - STEPS
        if self.flag_t is None and _hang_active(self.url):
            self.flag_t = now
        if self.last_step_t is None or self.steps_seen < STEPS:
            return True
        waited = now - self.last_step_t
        if self.quiet:
            return waited < self.pause + 4 * self.step_s
        return self.flag_t is None and waited < 240

    def stop(self) -> None:
        if self.exporter.poll() is not None:
            return
        hs.stop(self.procs)
        self.exporter.terminate()
        self.exporter.wait(30)
        if self.server is not None:
            self.server.close()

    def report(self) -> list[str]:
        from monitor.store import RunStore

        store = RunStore(self.dir / "run.db", create=False)
        hangs = [f for f in store.flags() if f.kind == "hang"]
        rounds = [e for e in store.events() if e.kind == "hang_dump"]
        store.close()
        took = None if self.flag_t is None or self.last_step_t is None else \
            self.flag_t - self.last_step_t
        out = [f"## {self.name}  (steps of {self.step_s:.0f} s)"]
        if self.quiet:
            out.append(f"expected: quiet. hang flags: {len(hangs)}; steps after the long phase: "
                       f"{self.steps_after}; py-spy rounds in the silence: {len(rounds)}")
            places = [(e.data.get("where") or {}) for e in rounds]
            out += [f"  round {i + 1}: place {w.get('place')}, long phase {w.get('long_phase')}, "
                    f"stuck {w.get('stuck')}" for i, w in enumerate(places[:3])]
        else:
            out.append(f"hang flag in /metrics {took:.1f} s after the last step line"
                       if took is not None else "NO hang flag within 240 s")
        for f in hangs[:1]:
            out.append(f"evidence: {f.evidence}")
            out.append(f"advice[0]: {f.advice[0] if f.advice else '-'}")
        return out


def run(cases: list[tuple], base: Path) -> list[str]:
    """Run ``cases`` side by side; the report lines."""
    running = [Case(spec, base) for spec in cases]
    for c in running:
        c.start()
    try:
        live = list(running)
        while live:
            time.sleep(0.5)
            done = [c for c in live if not c.poll()]
            for c in done:  # its flag as first opened: stop it now
                c.stop()
            live = [c for c in live if c not in done]
    finally:
        for c in running:
            c.stop()
    return [line for c in running for line in c.report() + [""]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--append", action="store_true", help="append to --out")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or args.only in c[0]]
    base = Path(tempfile.mkdtemp(prefix="hang_where_"))
    head = [f"# bench/hang_where.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            "# the real exporter (shipped settings: 1 s sampling, 30 s detector interval, "
            "defaults.yaml hang section), py-spy on by default, following the stand-in job's log",
            ""]
    lines = head
    for batch in (cases[:5], cases[5:]):  # a box of 2 cores: the busy loops in two batches
        if batch:
            lines += run(batch, base)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a" if args.append else "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
