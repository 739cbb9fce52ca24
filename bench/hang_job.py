"""A verl-shaped job that hangs on purpose: the ranks of ``bench/hang_scenarios.py``.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29700 \
        python3 bench/hang_job.py --fault stop --fault-rank 1 --fault-step 5 >> train.log

Every rank computes on its GPU for ``--step-s`` seconds (bf16 matmuls), then all-reduces its
gradient-sized buffer, like an update step; rank 0 prints verl's console line
(``step:N - timing_s/gen:... - timing_s/step:...``) after each step. Faults, from step
``--fault-step`` on the rank ``--fault-rank``:

- ``stop``: the rank sleeps in Python before the all-reduce (a data loader or a branch only
  some ranks take): the others wait in the collective;
- ``kill``: the rank sends itself SIGKILL before the all-reduce. Under NCCL the others then
  wait in the all-reduce (until NCCL's timeout); over gloo they would fail at once (gloo sees
  the peer's connection close), so with ``--backend gloo`` the rank first forks a child that
  holds its sockets open for ``--hold-s`` seconds and does nothing else: the others wait in the
  all-reduce for the dead rank as under NCCL;
- ``kernel``: the rank spins in a GPU kernel (``torch.cuda._sleep``) with the all-reduce queued
  behind it;
- ``validation``: every rank generates (busy GPU) for ``--long-s`` seconds between two steps,
  and rank 0 reports it as ``timing_s/testing`` (a healthy long phase);
- ``checkpoint``: every rank writes a file on the CPU for ``--long-s`` seconds between two
  steps (GPUs idle), reported as ``timing_s/save_checkpoint``.

``--backend gloo`` all-reduces CPU tensors (two ranks can then share one GPU, which NCCL
refuses); the GPU work stays on the GPU. Without a GPU (the bench's ``--dry-run``) the work runs
on the CPU (smaller float32 matmuls; ``kernel`` then computes forever instead of spinning).

Each rank prints one line with Ray's prefix, ``(WorkerDict pid=P) rank R of W ...``, as Ray
forwards a verl worker's output to the driver's log; ``--title ray::WorkerDict.update_actor``
also gives the rank the process title Ray gives it (``setproctitle``, which Ray itself uses).
The monitor finds a job's processes by those two (a Ray prefix in the log whose PID has a Ray
title) or by the GPU they hold: a rank on the CPU holds none.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def hold_sockets(seconds: float, titled: bool) -> None:
    """Fork a child that keeps this process's sockets open for ``seconds`` and exits: a peer
    blocked on them waits (as an NCCL peer of a dead rank does) instead of failing."""
    if os.fork() == 0:
        if titled:
            import setproctitle

            setproctitle.setproctitle("hang_job socket holder")
        time.sleep(seconds)
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--step-s", type=float, default=4.0)
    p.add_argument("--fault", default="none",
                   choices=("none", "stop", "kill", "kernel", "validation", "checkpoint"))
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-step", type=int, default=5)
    p.add_argument("--long-s", type=float, default=100.0)
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    p.add_argument("--hold-s", type=float, default=300.0,
                   help="kill over gloo: how long the dead rank's sockets stay open")
    p.add_argument("--title", default="",
                   help="the process title to take, e.g. ray::WorkerDict.update_actor (needs "
                   "the setproctitle package)")
    args = p.parse_args(argv)
    if args.title:
        import setproctitle

        setproctitle.setproctitle(args.title)

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", rank % ngpu) if ngpu else torch.device("cpu")
    if ngpu:
        torch.cuda.set_device(dev)
    if args.backend == "nccl":
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
        buf = torch.ones(16 * 1024 * 1024, device=dev)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        buf = torch.ones(4 * 1024 * 1024)
    if ngpu:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    else:
        a = torch.randn(256, 256)
    pid = os.getpid()
    print(f"(WorkerDict pid={pid}) rank {rank} of {world} on {dev}, {args.backend}", flush=True)

    def busy(seconds: float) -> None:
        nonlocal a
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            for _ in range(8):
                a = (a @ a).clamp_(-1, 1)
            if ngpu:
                torch.cuda.synchronize()

    for step in range(1, args.steps + 1):
        t0 = time.monotonic()
        extra: dict[str, float] = {}
        faulty = rank == args.fault_rank and step >= args.fault_step
        if step == args.fault_step and args.fault == "validation":
            busy(args.long_s)
            extra["timing_s/testing"] = args.long_s
        if step == args.fault_step and args.fault == "checkpoint":
            t_end = time.monotonic() + args.long_s
            with open(f"/tmp/hang_job_ckpt_{rank}.bin", "wb") as fh:
                while time.monotonic() < t_end:
                    fh.write(os.urandom(1 << 20))
                    time.sleep(0.01)
            extra["timing_s/save_checkpoint"] = args.long_s
        t_gen = time.monotonic()
        busy(args.step_s * 0.6)
        gen = time.monotonic() - t_gen
        t_upd = time.monotonic()
        busy(args.step_s * 0.3)
        if faulty and args.fault == "stop":
            print(f"rank {rank} (pid {pid}) stops before the all-reduce of step {step}",
                  file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        if faulty and args.fault == "kill":
            print(f"rank {rank} (pid {pid}) kills itself", file=sys.stderr, flush=True)
            if args.backend == "gloo":
                hold_sockets(args.hold_s, bool(args.title))
            os.kill(pid, signal.SIGKILL)
        if faulty and args.fault == "kernel":
            print(f"rank {rank} (pid {pid}) spins in a kernel", file=sys.stderr, flush=True)
            if ngpu:
                torch.cuda._sleep(int(1e13))
            else:
                busy(float("inf"))
        dist.all_reduce(buf)
        if args.backend == "nccl":
            torch.cuda.synchronize()
        upd = time.monotonic() - t_upd
        total = time.monotonic() - t0 - sum(extra.values())
        if rank == 0:
            parts = [f"step:{step}", f"timing_s/gen:{gen!r}", f"timing_s/update_actor:{upd!r}",
                     f"timing_s/step:{total!r}"] + [f"{k}:{v!r}" for k, v in extra.items()]
            print(f"(TaskRunner pid={pid}) " + " - ".join(parts), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
