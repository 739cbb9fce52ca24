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
from dataclasses import replace
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


def launcher_script(folder: Path) -> Path:
    """A ``verl-monitor`` console script (what ``pip install`` makes) for this interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "verl-monitor"
    path.write_text(f"#!{sys.executable}\nimport sys\n"
                    "try:\n    from cli.main import main\n"
                    "except ImportError:\n    from monitor.cli import main\n"
                    "sys.exit(main())\n")
    path.chmod(0o755)
    return path


def command(case: Case, work: Path, data: Path, tool: Path, resume: bool = False) -> list[str]:
    """``timeout ... verl-monitor run ... -- python3 -m verl.trainer.main_ppo ...`` (``resume``:
    a kill case's second attempt; the same ``--log``, appended, and the same ``--store``)."""
    exp = (f"--store {work}/store.db --interval 1 --hang-pyspy --fr-dir {work}/fr "
           f"{os.environ.get('VERL_REAL_EXPORTER_EXTRA', '')}").strip()
    return ["timeout", "-k", "15", str(int(case.timeout_s)), str(tool),
            "run", "--log", str(work / "train.log"), "--listen-address", "127.0.0.1:0",
            "--node", "h200", "--linger", "3", "--exporter-args", exp, "--",
            sys.executable, "-m", "verl.trainer.main_ppo",
            *overrides(case, work, data, resume=resume)]


class LogWatch:
    """Follows the case's log: the last step seen and when its line appeared."""

    def __init__(self, path: Path, pos: int = 0):
        self.path, self.pos, self.last_step, self.last_step_at = path, pos, 0, None
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


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


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


class Running:
    """One case in flight: its process group, stack sampler and log watch."""

    def __init__(self, case: Case, root: Path, data: Path, tool: Path, attempt: int = 1):
        self.case, self.work, self.attempt = case, root / case.name, attempt
        for sub in ("markers", "fr", "stacks"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **environment(case, self.work), "PYTHONPATH": pythonpath(case),
               "PATH": f"{tool.parent}:/tmp/site/bin:" + os.environ.get("PATH", "")}
        argv = command(case, self.work, data, tool, resume=attempt > 1)
        tag = "" if attempt == 1 else f"_{attempt}"
        (self.work / f"command{tag}.txt").write_text(" ".join(argv) + "\n")
        log = self.work / "train.log"
        offset = log.stat().st_size if log.exists() else 0  # a later attempt appends
        self.t0 = time.time()
        self.proc = subprocess.Popen(argv, cwd=self.work, env=env,
                                     stdout=open(self.work / f"runner{tag}.out", "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.sampler = StackSampler("/tmp/site/bin/py-spy", self.work / "stacks",
                                    interval=10.0, root=self.proc.pid)
        self.sampler.start()
        self.watch, self.ended_by, self.t1 = LogWatch(log, offset), None, None
        self.killed_at: float | None = None

    def kill_job(self) -> list[int]:
        """SIGKILL the job's own process group (verl-monitor run starts it in one: verl's
        launcher, and the Ray processes it started), as a lost node would end it; verl-monitor
        run itself lives on and records the exit status. The pids signalled."""
        import psutil

        groups = set()
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
                if ("verl.trainer.main_ppo" in cmd and not cmd.startswith("ray::")
                        and "monitor" not in cmd.split(" -- ")[0]):
                    groups.add(os.getpgid(p.pid))
            except (psutil.Error, OSError):
                continue
        self.killed_at = time.time()
        hit = []
        for g in groups:
            hit += [p.pid for p in psutil.process_iter() if _pgid(p.pid) == g]
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.ended_by = (f"SIGKILL of the job's process group {sorted(groups)} "
                         f"({len(hit)} processes) after step {self.watch.last_step}")
        return hit

    def poll(self) -> bool:
        """Follow the log, end a held hang; True while the job runs."""
        if self.t1 is not None:
            return False
        self.watch.poll()
        hold, w = self.case.hold_after_silence, self.watch
        if (self.proc.poll() is None and hold and any((self.work / "markers").iterdir())
                and w.last_step_at and time.time() - w.last_step_at > hold):
            self.ended_by = f"hang held {hold:.0f} s after the last step"
            end_group(self.proc, self.ended_by, self.work / "train.log")
        if self.proc.poll() is None:
            return True
        self.watch.poll()
        self.t1 = time.time()
        self.sampler.stop()
        return False

    def timing(self, together: list[str]) -> dict:
        rc, w = self.proc.returncode, self.watch
        return {"case": self.case.name, "attempt": self.attempt, "rc": rc,
                "killed_at": self.killed_at, "start": self.t0, "end": self.t1,
                "wall_s": round(self.t1 - self.t0, 1), "last_step": w.last_step,
                "last_step_at": w.last_step_at, "first_line_at": w.first_line_at,
                "ended_by": self.ended_by or ("timeout" if rc in (124, 137) else "exit"),
                "stack_dumps": self.sampler.dumps, "stack_failures": self.sampler.failed,
                "concurrent_with": [n for n in together if n != self.case.name]}


def ckpt_listing(work: Path, name: str) -> None:
    """What verl's checkpoint folder holds now (names and sizes) into ``work/name``."""
    ckpt, lines = work / "ckpt", []
    for f in sorted(ckpt.rglob("*")) if ckpt.is_dir() else []:
        if f.is_file():
            lines.append(f"{f.stat().st_size:>12} {f.relative_to(ckpt)}")
    latest = ckpt / "latest_checkpointed_iteration.txt"
    head = f"# {time.time():.3f} latest_checkpointed_iteration.txt: " + (
        latest.read_text().strip() if latest.exists() else "(none)")
    (work / name).write_text("\n".join([head, *lines]) + "\n")


def run_kill_resume(case: Case, root: Path, data: Path, tool: Path) -> list[dict]:
    """Attempt 1 until step ``case.kill_after_step``'s line is out, then SIGKILL its job's
    process group and stop Ray; attempt 2, the same command with ``case.resume_knobs``, to its
    end. One timing for the case, both attempts in ``attempts``."""
    first = Running(case, root, data, tool)
    while first.poll():
        if first.killed_at is None and first.watch.last_step >= case.kill_after_step:
            hit = first.kill_job()
            print(f"KILL {case.name}: step {first.watch.last_step} out; SIGKILL to "
                  f"{len(hit)} processes", flush=True)
        time.sleep(0.2)
    ckpt_listing(first.work, "ckpt_after_kill.txt")
    t_clean = time.time()
    clean_ray()
    gap = {"ray_stop_s": round(time.time() - t_clean, 1)}
    used = time.time() - first.t0
    second_case = replace(case, timeout_s=max(60.0, case.timeout_s - used))
    second = Running(second_case, root, data, tool, attempt=2)
    while second.poll():
        time.sleep(1)
    clean_ray()
    ckpt_listing(second.work, "ckpt_at_end.txt")
    t1, t2 = first.timing([case.name]), second.timing([case.name])
    return [{**t2, "attempt": None, "start": t1["start"], "wall_s": round(t2["end"] - t1["start"], 1),
             "ended_by": f"attempt 1: {t1['ended_by']}; attempt 2: {t2['ended_by']}",
             "stack_dumps": t1["stack_dumps"] + t2["stack_dumps"],
             "stack_failures": t1["stack_failures"] + t2["stack_failures"],
             "attempts": [t1, t2], "between": gap, "concurrent_with": []}]


def run_group(cases: list[Case], root: Path, data: Path, tool: Path) -> list[dict]:
    """Run cases side by side (one Ray instance each) until all end; return their timings."""
    if any(c.kill_after_step for c in cases):
        assert len(cases) == 1, "a kill case runs alone"
        return run_kill_resume(cases[0], root, data, tool)
    running = [Running(c, root, data, tool) for c in cases]
    while any([r.poll() for r in running]):
        time.sleep(1)
    clean_ray()
    return [r.timing([c.name for c in cases]) for r in running]


def finish_case(case: Case, root: Path, timing: dict, tool: Path) -> None:
    """Export the store, analyze the log, write meta.json."""
    work = root / case.name
    env = {**os.environ, "PYTHONPATH": f"{CODE}:/tmp/site"}
    exp = work / "export"
    if (work / "store.db").exists():
        subprocess.run([str(tool), "export", str(work / "store.db"),
                        "--out", str(exp)], cwd=work, env=env, capture_output=True, timeout=120)
    args = [str(tool), "analyze", str(work / "train.log"), "--json", "--stacks",
            str(work / "stacks")]
    for flag, name in (("--gpu", "gpu.csv"), ("--host", "host.csv"),
                       ("--events", "events.json")):
        if (exp / name).exists():
            args += [flag, str(exp / name)]
    r = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    if r.returncode != 0:  # a monitor from before ``analyze --stacks``
        r = subprocess.run(args[:4] + args[6:], cwd=work, env=env, capture_output=True,
                           text=True, timeout=180)
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
            "knobs": [k.format(data=root.parent) for k in case.knobs], "batch": case.batch,
            "attn": case.attn, "reward": case.reward, "env": case.env,
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
    ap.add_argument("--cases", default=",".join(c.name for c in CASES),
                    help="comma-separated; a+b runs a and b side by side on the GPU")
    ap.add_argument("--deadline", type=float, default=540, help="seconds for all cases")
    ap.add_argument("--http-port", type=int, default=18099)
    args = ap.parse_args()
    t_start = time.time()
    root, out = Path(args.work) / "runs", Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    tool = launcher_script(Path(args.work) / "bin")
    blackhole_server(args.http_port)
    os.environ["VERL_REAL_HTTP_URL"] = f"http://127.0.0.1:{args.http_port}/judge"
    timings: list[dict] = []
    for group in args.cases.split(","):
        cases = [BY_NAME[n] for n in group.split("+")]
        left = args.deadline - (time.time() - t_start)
        need = max(c.estimate_s for c in cases)
        if need > left:
            print(f"SKIP {group}: needs ~{need:.0f} s, {left:.0f} s left", flush=True)
            timings += [{"case": c.name, "skipped": True} for c in cases]
            continue
        cases = [_fit(c, left) for c in cases]
        done = run_group(cases, root, Path(args.work), tool)
        for case, timing in zip(cases, done, strict=True):
            try:
                finish_case(case, root, timing, tool)
            except Exception as exc:  # noqa: BLE001 - keep going; raw files are packed anyway
                print(f"finish {case.name} failed: {exc!r}", flush=True)
            timings.append(timing)
            print(f"CASE {case.name}: rc={timing['rc']} wall={timing['wall_s']} s "
                  f"last_step={timing['last_step']} ended_by={timing['ended_by']} "
                  f"stacks={timing['stack_dumps']}/{timing['stack_failures']} failed "
                  f"with={timing['concurrent_with']}", flush=True)
        (root / "timings.json").write_text(json.dumps(timings, indent=1))
        pack(root, out)
    print(f"ALL DONE in {time.time() - t_start:.0f} s", flush=True)


def _fit(case: Case, left: float) -> Case:
    """Cap the case's hard timeout by what is left of the deadline."""
    return replace(case, timeout_s=max(60.0, min(case.timeout_s, left - 10)))


if __name__ == "__main__":
    main()
