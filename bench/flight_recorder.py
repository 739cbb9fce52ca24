"""PyTorch's Flight Recorder on a real GPU: what it costs a step, how fast a dump arrives.

Run on the GPU machine (it needs torch with NCCL)::

    python3 bench/flight_recorder.py --out "$OUT"

Parts, each a separate child process of this script (``--child``), one rank per GPU:

1. **cost**: the same job (a matmul block and ``--colls`` small all-reduces per step) with the
   Flight Recorder off (``TORCH_FR_BUFFER_SIZE=0``) and on at the documented 2,000 entries,
   alternated ``--rounds`` times; prints the median step time of each and their ratio.
2. **dump**: a running rank is asked for its Flight Recorder through its debug-info FIFO
   (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``), the way ``monitor.hang.request`` asks; prints how long
   the dump took to appear, whole, in ``TORCH_FR_DUMP_TEMP_FILE``; keeps the pickle.
3. **stuck**: a rank spins in a GPU kernel (``torch.cuda._sleep``) with an all-reduce queued
   behind it, its Python thread blocked on the result; the dump is requested while it is stuck.
4. **two_ranks_one_gpu**: whether NCCL lets two ranks share this GPU (the hang cases with two
   ranks need it when only one GPU is lent); the error text is recorded.

Writes ``flight_recorder_<date>_<gpu>.txt`` and the dumps (``fr_*.pkl``) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(args: argparse.Namespace) -> int:
    """One rank: init NCCL, run steps, print one JSON line per step."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = int(os.environ.get("LOCAL_GPU", str(rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", dev))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    small = [torch.ones(1024, device="cuda") for _ in range(args.colls)]
    dist.all_reduce(small[0])
    torch.cuda.synchronize()
    print(json.dumps({"ready": True, "pid": os.getpid(), "rank": rank}), flush=True)
    for step in range(args.steps):
        t0 = time.perf_counter()
        if args.stuck_at is not None and step == args.stuck_at:
            # a kernel that spins for a long time, with the next all-reduce queued behind it
            torch.cuda._sleep(int(args.stuck_cycles))
            print(json.dumps({"stuck": True, "step": step}), flush=True)
        for _ in range(4):
            a = (a @ a).clamp_(-1, 1)
        for t in small:
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt_ms = (time.perf_counter() - t0) * 1000
        print(json.dumps({"step": step, "ms": dt_ms}), flush=True)
        if args.sleep_s:
            time.sleep(args.sleep_s)
    dist.destroy_process_group()
    return 0


def _env(fr_size: int | None, dump_dir: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1")
    env["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env.pop(name, None)
        if fr_size is not None:
            env[name] = str(fr_size)
    if dump_dir:
        env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] = f"{dump_dir}/pipe_"
        env["TORCH_FR_DUMP_TEMP_FILE"] = f"{dump_dir}/fr_"
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = f"{dump_dir}/fr_"
    return env


def _run_steps(fr_size: int | None, steps: int, colls: int) -> list[float]:
    cmd = [sys.executable, __file__, "--child", "--steps", str(steps), "--colls", str(colls)]
    out = subprocess.run(cmd, env=_env(fr_size), capture_output=True, text=True, timeout=300)
    ms = [json.loads(x)["ms"] for x in out.stdout.splitlines() if x.startswith('{"step"')]
    if not ms:
        raise RuntimeError(f"child failed: {out.stderr[-2000:]}")
    return ms[3:]  # warm-up steps left out


def _wait_dump(path: Path, timeout: float) -> float | None:
    """Seconds until ``path`` holds a whole pickle, None on timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.stat().st_size > 0:
            try:
                with open(path, "rb") as fh:
                    pickle.load(fh)
                return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - still being written
                pass
        time.sleep(0.01)
    return None


def _request(pipe: Path) -> str:
    """Write one byte to the rank's FIFO without blocking; returns what happened."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        return f"open failed: {exc}"
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    return "written"


def _dump_case(out: Path, name: str, extra: list[str], wait_for: str,
               report: list[str]) -> None:
    d = Path(tempfile.mkdtemp(prefix="fr_"))
    cmd = [sys.executable, __file__, "--child"] + extra
    p = subprocess.Popen(cmd, env=_env(2000, str(d)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            line = p.stdout.readline()
            if not line:
                break
            if wait_for in line:
                break
        time.sleep(2.0)
        pipe = d / "pipe_0.pipe"
        t_pipe = time.monotonic()
        while not pipe.exists() and time.monotonic() - t_pipe < 10:
            time.sleep(0.05)
        report.append(f"{name}: pipe present: {pipe.exists()} ({sorted(os.listdir(d))})")
        _pyspy(p.pid, out, name, report)
        t_req = time.monotonic()
        what = _request(pipe)
        took = _wait_dump(d / "fr_0", 60.0)
        report.append(f"{name}: request {what}; dump whole after "
                      + (f"{took:.3f} s" if took is not None else "no dump within 60 s")
                      + f" (request at +{t_req - t0:.1f} s)")
        if took is not None:
            data = (d / "fr_0").read_bytes()
            (out / f"fr_{name}.pkl").write_bytes(data)
            obj = pickle.loads(data)
            report.append(f"{name}: dump {len(data)} bytes; keys {sorted(obj)}")
            ents = obj.get("entries", [])
            report.append(f"{name}: {len(ents)} entries; pg_status {obj.get('pg_status')}")
            if ents:
                report.append(f"{name}: last entry {json.dumps(ents[-1], default=str)[:1500]}")
    finally:
        p.kill()
        p.wait()


def _pyspy(pid: int, out: Path, name: str, report: list[str]) -> None:
    """py-spy's dump of the rank, timed (when py-spy is installed)."""
    import shutil

    exe = shutil.which("py-spy")
    if not exe:
        report.append(f"{name}: py-spy not installed")
        return
    t0 = time.monotonic()
    r = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True,
                       timeout=60)
    took = time.monotonic() - t0
    (out / f"pyspy_{name}.txt").write_text(r.stdout + r.stderr)
    report.append(f"{name}: py-spy dump rc={r.returncode} in {took:.2f} s, "
                  f"{len(r.stdout.splitlines())} lines")


def _two_ranks(report: list[str]) -> None:
    env0, env1 = _env(2000), _env(2000)
    for i, env in enumerate((env0, env1)):
        env.update(RANK=str(i), WORLD_SIZE="2", LOCAL_GPU="0", MASTER_PORT="29811")
    cmd = [sys.executable, __file__, "--child", "--steps", "3", "--colls", "2"]
    ps = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) for e in (env0, env1)]
    for i, p in enumerate(ps):
        try:
            o, e = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        err = [x for x in e.splitlines() if "rror" in x or "WARN" in x][-3:]
        report.append(f"two_ranks_one_gpu rank {i}: rc={p.returncode} steps="
                      f"{o.count(chr(34) + 'step' + chr(34))} err={err}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--colls", type=int, default=200, help="small all-reduces per step")
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--stuck-at", type=int, default=None)
    p.add_argument("--stuck-cycles", type=float, default=2e11)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    if args.child:
        return _child(args)
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0).replace(" ", "_")
    report = [f"torch {torch.__version__}, nccl {torch.cuda.nccl.version()}, {gpu}, "
              f"{dt.datetime.now().isoformat(timespec='seconds')}"]
    off, on = [], []
    for _ in range(args.rounds):
        off += _run_steps(0, args.steps, args.colls)
        on += _run_steps(2000, args.steps, args.colls)
    m_off, m_on = statistics.median(off), statistics.median(on)
    report.append(f"cost: {args.colls} all-reduces + 4 bf16 4k matmuls per step, "
                  f"{len(off)} steps each: FR off {m_off:.2f} ms, FR 2000 {m_on:.2f} ms, "
                  f"ratio {m_on / m_off:.3f}")
    _dump_case(out, "running", ["--steps", "100000", "--colls", "20", "--sleep-s", "0.05"],
               '"step": 5,', report)
    _dump_case(out, "stuck_kernel", ["--steps", "100", "--colls", "4", "--stuck-at", "3"],
               '"stuck"', report)
    _two_ranks(report)
    text = "\n".join(report)
    print(text)
    (out / f"flight_recorder_{dt.date.today()}_{gpu}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
