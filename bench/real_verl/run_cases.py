"""Run real verl cases on the GPU machine, each under the project's own ``verl-monitor run``.

For each case (``cases.py``): the job runs as ``python3 -m monitor run --log CASE/train.log
--exporter-args "--store CASE/store.db --interval 1 --hang-pyspy --fr-dir CASE/fr" --
python3 -m verl.trainer.main_ppo ...`` with the real NVML backend; py-spy dumps of the
TaskRunner, WorkerDict and DataLoader workers are taken every 10 s (``stacks.py``); hang cases
are ended ``hold_after_silence`` seconds after their last ``step:`` line. Afterwards the store is
exported (``monitor export``), analyzed (``monitor analyze --json``), a ``meta.json`` written,
and everything so far packed into ``$OUT/real_verl.tar.gz`` (rewritten after each case, so a
call cut short still brings back what finished).

    python3 bench/real_verl/run_cases.py --work /tmp/verl_real --out $OUT \
        --deadline 540 [--cases healthy,hang_reward,...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import BY_NAME, CASES, HERE, Case, environment, overrides  # noqa: E402
from stacks import StackSampler  # noqa: E402

REPO = HERE.parent.parent
#: the monitor's code as committed (prepare.sh), so others' unfinished edits do not travel
CODE = REPO / ".vm_snapshot" if (REPO / ".vm_snapshot" / "monitor").is_dir() else REPO
STEP_LINE = re.compile(r"step:(\d+) - ")


def blackhole_server(port: int) -> threading.Thread:
    """An HTTP 'judge' that accepts connections and never answers (hang_http)."""
    held: list[socket.socket] = []
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            held.append(conn)

    t = threading.Thread(target=serve, daemon=True, name="blackhole")
    t.start()
    return t


def pythonpath(case: Case) -> str:
    parts = [str(CODE), str(REPO / ".verl_src"), str(HERE / "shim"), "/tmp/site"]
    if case.hooks:
        parts.insert(0, str(HERE / "hooks"))
    old = os.environ.get("PYTHONPATH", "")
    return ":".join(p for p in parts + [old] if p)


def command(case: Case, work: Path, data: Path) -> list[str]:
    """``timeout ... python3 -m monitor run ... -- python3 -m verl.trainer.main_ppo ...``."""
    exp = (f"--store {work}/store.db --interval 1 --hang-pyspy --fr-dir {work}/fr "
           f"--node h200 {os.environ.get('VERL_REAL_EXPORTER_EXTRA', '')}").strip()
    return ["timeout", "-k", "15", str(int(case.timeout_s)), sys.executable, "-m", "monitor",
            "run", "--log", str(work / "train.log"), "--listen-address", "127.0.0.1:0",
            "--node", "h200", "--linger", "3", "--exporter-args", exp, "--",
            sys.executable, "-m", "verl.trainer.main_ppo", *overrides(case, work, data)]


class LogWatch:
    """Follows the case's log: the last step seen and when its line appeared."""

    def __init__(self, path: Path):
        self.path, self.pos, self.last_step, self.last_step_at = path, 0, 0, None
        self.first_line_at = None

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            chunk = f.read()
            self.pos += len(chunk)
        if chunk and self.first_line_at is None:
            self.first_line_at = time.time()
        for m in STEP_LINE.finditer(chunk.decode("utf-8", "replace")):
            self.last_step, self.last_step_at = int(m.group(1)), time.time()


def end_group(proc: subprocess.Popen, why: str, log: Path) -> None:
    """SIGTERM the case's process group (verl-monitor run forwards it), SIGKILL after 15 s."""
    with open(log, "a") as f:
        f.write(f"\n# run_cases: ending the job ({why}) at {time.time():.3f}\n")
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def clean_ray() -> None:
    """Stop this case's Ray processes (the machine runs nothing else of Ray)."""
    subprocess.run(["/tmp/site/bin/ray", "stop", "--force"], capture_output=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": "/tmp/site"})
    for _ in range(30):
        try:
            r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid",
                                "--format=csv,noheader"], capture_output=True, text=True)
        except OSError:
            return
        if not r.stdout.strip():
            return
        time.sleep(1)


def run_case(case: Case, root: Path, data: Path) -> dict:
    """Run one case to its end (or its hold / timeout); return its timings."""
    work = root / case.name
    for sub in ("markers", "fr", "stacks"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **environment(case, work), "PYTHONPATH": pythonpath(case),
           "PATH": "/tmp/site/bin:" + os.environ.get("PATH", "")}
    argv = command(case, work, data)
    (work / "command.txt").write_text(" ".join(argv) + "\n")
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=open(work / "runner.out", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    sampler = StackSampler("/tmp/site/bin/py-spy", work / "stacks", interval=10.0)
    sampler.start()
    watch, ended_by = LogWatch(work / "train.log"), None
    while proc.poll() is None:
        time.sleep(1)
        watch.poll()
        marked = any((work / "markers").iterdir())
        if (case.hold_after_silence and marked and watch.last_step_at
                and time.time() - watch.last_step_at > case.hold_after_silence):
            ended_by = f"hang held {case.hold_after_silence:.0f} s after the last step"
            end_group(proc, ended_by, work / "train.log")
    watch.poll()
    t1 = time.time()
    sampler.stop()
    clean_ray()
    return {"case": case.name, "rc": proc.returncode, "start": t0, "end": t1,
            "wall_s": round(t1 - t0, 1), "last_step": watch.last_step,
            "last_step_at": watch.last_step_at, "first_line_at": watch.first_line_at,
            "ended_by": ended_by or ("timeout" if proc.returncode in (124, 137) else "exit"),
            "stack_dumps": sampler.dumps, "stack_failures": sampler.failed}


def finish_case(case: Case, root: Path, timing: dict) -> None:
    """Export the store, analyze the log, write meta.json."""
    work = root / case.name
    env = {**os.environ, "PYTHONPATH": f"{CODE}:/tmp/site"}
    exp = work / "export"
    if (work / "store.db").exists():
        subprocess.run([sys.executable, "-m", "monitor", "export", str(work / "store.db"),
                        "--out", str(exp)], cwd=work, env=env, capture_output=True, timeout=120)
    args = [sys.executable, "-m", "monitor", "analyze", str(work / "train.log"), "--json"]
    for flag, name in (("--gpu", "gpu.csv"), ("--host", "host.csv"),
                       ("--events", "events.json")):
        if (exp / name).exists():
            args += [flag, str(exp / name)]
    r = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    (work / "analyze.json").write_text(r.stdout)
    (work / "analyze.err").write_text(r.stderr[-20000:])
    markers = {}
    for m in sorted((work / "markers").glob("*.json")):
        markers[m.stem] = json.loads(m.read_text())
    commit = (REPO / ".verl_src" / "COMMIT")
    meta = {"case": case.name, "what": case.what, "verl_commit":
            commit.read_text().strip() if commit.exists() else "4c3310db",
            "verl_version": "0.5.0.dev", "monitor_commit": _monitor_commit(), "rollout": "hf", "gpus": 1, "gpu": "NVIDIA H200",
            "model": case.model, "steps": case.steps, "fault_step": case.fault_step,
            "knobs": list(case.knobs), "reward": case.reward, "env": case.env,
            "expect": list(case.expect), "injected": markers, **timing}
    (work / "meta.json").write_text(json.dumps(meta, indent=1))


def _monitor_commit() -> str:
    f = CODE / "COMMIT"
    return f.read_text().strip() if f.exists() else "working tree"


def pack(root: Path, out: Path) -> None:
    """All cases so far into out/real_verl.tar.gz (checkpoints and Hydra dirs left out)."""
    tmp = out / "real_verl.tar.gz.part"
    with tarfile.open(tmp, "w:gz") as tar:
        for case_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name in BY_NAME):
            for f in sorted(case_dir.rglob("*")):
                rel = f.relative_to(root)
                if f.is_file() and rel.parts[1] not in ("ckpt", "hydra", "fr"):
                    tar.add(f, arcname=str(rel))
        for f in ("timings.json", "setup.log"):
            if (root / f).exists():
                tar.add(root / f, arcname=f)
    tmp.rename(out / "real_verl.tar.gz")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/verl_real")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/verl_real_out"))
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    ap.add_argument("--deadline", type=float, default=540, help="seconds for all cases")
    ap.add_argument("--http-port", type=int, default=18099)
    args = ap.parse_args()
    t_start = time.time()
    root, out = Path(args.work) / "runs", Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    blackhole_server(args.http_port)
    os.environ["VERL_REAL_HTTP_URL"] = f"http://127.0.0.1:{args.http_port}/judge"
    timings = []
    for name in args.cases.split(","):
        case = BY_NAME[name]
        left = args.deadline - (time.time() - t_start)
        if case.estimate_s > left:
            print(f"SKIP {name}: needs ~{case.estimate_s:.0f} s, {left:.0f} s left", flush=True)
            timings.append({"case": name, "skipped": True})
            continue
        case = _fit(case, left)
        timing = run_case(case, root, Path(args.work))
        try:
            finish_case(case, root, timing)
        except Exception as exc:  # noqa: BLE001 - keep going; the raw files are packed anyway
            print(f"finish {name} failed: {exc!r}", flush=True)
        timings.append(timing)
        (root / "timings.json").write_text(json.dumps(timings, indent=1))
        print(f"CASE {name}: rc={timing['rc']} wall={timing['wall_s']} s "
              f"last_step={timing['last_step']} ended_by={timing['ended_by']} "
              f"stacks={timing['stack_dumps']}/{timing['stack_failures']} failed", flush=True)
        pack(root, out)
    print(f"ALL DONE in {time.time() - t_start:.0f} s", flush=True)


def _fit(case: Case, left: float) -> Case:
    """Cap the case's hard timeout by what is left of the deadline."""
    from dataclasses import replace

    return replace(case, timeout_s=max(60.0, min(case.timeout_s, left - 10)))


if __name__ == "__main__":
    main()
