"""The verl-shaped RL job: one process per GPU, rank 0 is the driver that prints the log.

    python3 -m bench.gpu_workload.job --scenario healthy --gpus 2 --steps 9 \
        --jsonl /tmp/run/train.jsonl > /tmp/run/train.log 2>&1

Each step does what verl's PPO/GRPO fit loop does, in its order:

- *before the step timer*: rank 0 takes the next batch from a ``DataLoader`` (prompt token ids;
  the dataset's ``__getitem__`` does the CPU work of tokenisation) and broadcasts it through
  NCCL; the other ranks wait in that broadcast, as verl's workers wait for the driver;
- ``gen``: each rank's rollout copy generates responses of varying lengths with ``generate``,
  in stages whose batch shrinks as sequences reach their length (continuous batching's shape);
- ``reward`` (rule-based, CPU), ``old_log_prob`` (actor forward), ``ref`` (reference forward),
  ``adv`` (group-normalised advantages on the driver's CPU);
- ``update_actor``: forward, backward and AdamW through DDP (gradient all-reduce over NCCL);
- ``update_weights``: the trainer's weights are broadcast through NCCL into the separate
  rollout copy.

Phase times are taken on the driver after every rank has finished the phase (a CUDA
synchronize and a one-element all-reduce), as verl's driver waits for its workers. Faults are
switched on by ``--scenario`` (``faults.py``); every fault is real work or a real limit, never
a sleep inside a phase timer (the NCCL hang stalls one rank *outside* any timer).

``--device cpu`` runs the same code on the CPU with gloo and a tiny model (to check the code
without a GPU); the numbers then mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from bench.gpu_workload.faults import SCENARIOS, Scenario, active, fault_rank

#: The Ray prefix of verl's synchronous trainer's driver (0.3-0.8: ``TaskRunner``), whose fit
#: loop this job follows (the batch fetched before the step timer). verl 0.9's V1 trainer
#: (``TaskRunnerV1``) fetches its batch inside the step timer: the recordings made before
#: 2026-12-03 printed that name by mistake and were corrected to this one (prefix only).
PREFIX = "(TaskRunner pid={pid}) "


def _np_repr(v: float | int) -> str:
    """verl 0.5+ under numpy 2 prints numpy scalars wrapped: ``np.float64(0.5)``."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"np.int64({v})"
    return f"np.float64({float(v)!r})"


def format_step_line(step: int, metrics: dict[str, float]) -> str:
    """One verl console line (0.5+, numpy 2): ``step:N - key:value - ...`` with numpy reprs."""
    parts = [f"step:{step}"] + [f"{k}:{_np_repr(v)}" for k, v in metrics.items()]
    return PREFIX.format(pid=os.getpid()) + " - ".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="healthy", choices=sorted(SCENARIOS))
    p.add_argument("--gpus", type=int, default=1, help="ranks, one per GPU (default 1)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--jsonl", default=None, help="also write the file logger's JSONL here")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=192, help="sequences per rank per step")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--resp-lens", default="64,96,128",
                   help="response lengths drawn per sequence (comma list)")
    p.add_argument("--tail-len", type=int, default=512, help="length forced by the long tail")
    p.add_argument("--micro", type=int, default=16, help="micro-batch of log-prob and update")
    p.add_argument("--stall-s", type=float, default=5.0, help="data stall per batch, seconds")
    p.add_argument("--oom-gib", type=float, default=32.0, help="memory kept per step (oom)")
    p.add_argument("--creep-gib", type=float, default=16.0,
                   help="memory kept per step (memory_creep)")
    p.add_argument("--reward-s", type=float, default=4.0,
                   help="CPU seconds of the reward function per step (cpu_reward)")
    p.add_argument("--offload-gib", type=float, default=4.0,
                   help="parameters moved host<->GPU per log-prob pass (offload)")
    p.add_argument("--pg-timeout-s", type=float, default=30.0)
    p.add_argument("--port", type=int, default=29531)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- data


class PromptData:
    """Random prompts; ``__getitem__`` does a tokeniser's worth of CPU work (more when stalled).

    Built lazily inside the worker so torch is imported there only.
    """

    def __init__(self, n: int, prompt_len: int, vocab: int, per_rank: int, world: int,
                 scn: Scenario, stall_s: float) -> None:
        self.n, self.prompt_len, self.vocab = n, prompt_len, vocab
        self.batch_total = per_rank * world
        self.scn, self.stall_s = scn, stall_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        step = i // self.batch_total + 1
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(3, self.vocab, (self.prompt_len,), generator=g)
        # a tokeniser's cost: a little pure-Python work per item
        text = " ".join(str(int(t)) for t in ids[:64])
        _ = sum(ord(c) for c in text)
        if self.scn.name == "data_stall" and active(self.scn, step):
            busy_until = time.perf_counter() + self.stall_s / self.batch_total
            x = 0
            while time.perf_counter() < busy_until:  # slow preprocessing, on the driver's core
                x += 1
        return ids


# ---------------------------------------------------------------------------- the worker


class Worker:
    """One rank: trainer (DDP), reference and rollout copies of the model, and the step."""

    def __init__(self, rank: int, world: int, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist
        from transformers import LlamaConfig, LlamaForCausalLM

        self.torch, self.dist = torch, dist
        self.rank, self.world, self.args = rank, world, args
        self.scn = SCENARIOS[args.scenario]
        self.fault_rank = fault_rank(self.scn, world)
        cpu = args.device == "cpu"
        if cpu:
            self.dev = torch.device("cpu")
            backend = "gloo"
        else:
            torch.cuda.set_device(rank)
            self.dev = torch.device("cuda", rank)
            backend = "nccl"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{args.port}",
                                timeout=timedelta(seconds=args.pg_timeout_s),
                                **({} if cpu else {"device_id": self.dev}))
        torch.manual_seed(1234)
        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                          intermediate_size=int(args.hidden * 8 / 3) // 64 * 64,
                          num_hidden_layers=args.layers,
                          num_attention_heads=max(1, args.hidden // 128),
                          num_key_value_heads=max(1, args.hidden // 128),
                          max_position_embeddings=4096, tie_word_embeddings=False)
        dtype = torch.float32 if cpu else torch.bfloat16
        self.dtype = dtype
        with torch.device(self.dev):  # random weights made on the device: no hub, no CPU init
            actor = LlamaForCausalLM(cfg).to(dtype)
        self.ref = copy.deepcopy(actor).eval()
        self.rollout = copy.deepcopy(actor).eval()
        self.rollout.generation_config.eos_token_id = None
        self.rollout.generation_config.pad_token_id = 0
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.actor = DDP(actor, device_ids=None if cpu else [rank])
        self.opt = torch.optim.AdamW(self.actor.parameters(), lr=1e-6)
        self.hoard: list[Any] = []
        self.hog: subprocess.Popen | None = None
        self.n_params = sum(p.numel() for p in actor.parameters())
        self.coll_reps = self._calibrate_collectives() if self.scn.name == "big_collectives" else 0

    # -- helpers

    def offload_round_trip(self) -> None:
        """Parameter offload's traffic: ``--offload-gib`` from pageable host memory to the GPU
        and back, as FSDP's param_offload moves the weights around each pass."""
        torch = self.torch
        if self.dev.type != "cuda":
            return
        n = int(self.args.offload_gib * (1 << 30)) // 2
        if getattr(self, "_host_params", None) is None:
            self._host_params = torch.ones(n, dtype=torch.bfloat16)  # pageable, not pinned
        on_gpu = self._host_params.to(self.dev)
        on_gpu.mul_(1)
        self._host_params.copy_(on_gpu.cpu())
        del on_gpu


    def sync(self) -> None:
        """Wait for this rank's GPU work and for every rank (the driver waits for its workers)."""
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()
        t = self.torch.ones(1, device=self.dev)
        self.dist.all_reduce(t)

    def _calibrate_collectives(self) -> int:
        """How many 2 GiB all-reduces take about 2 s here (same count on every rank)."""
        torch = self.torch
        n = (1 << 30) if self.dev.type == "cuda" else (1 << 16)
        self.big = torch.ones(n, device=self.dev, dtype=self.dtype)
        self.dist.all_reduce(self.big)
        self.sync()
        t0 = time.perf_counter()
        for _ in range(3):
            self.dist.all_reduce(self.big)
        self.sync()
        each = max((time.perf_counter() - t0) / 3, 1e-4)
        reps = torch.tensor([min(400, math.ceil(2.0 / each))], device=self.dev)
        self.dist.all_reduce(reps, op=self.dist.ReduceOp.MAX)
        return int(reps.item())

    # -- phases

    def generate(self, prompts: Any, step: int) -> tuple[Any, list[int]]:
        """Responses of varying length, generated in stages whose batch shrinks (rollout)."""
        torch = self.torch
        args = self.args
        lens_choice = [int(x) for x in args.resp_lens.split(",")]
        g = torch.Generator().manual_seed(step * 1000 + self.rank)
        idx = torch.randint(0, len(lens_choice), (prompts.shape[0],), generator=g)
        targets = [lens_choice[int(i)] for i in idx]
        if self.scn.name == "long_tail" and active(self.scn, step) and self.rank == self.fault_rank:
            for k in range(min(3, len(targets))):
                targets[k] = args.tail_len
        stages = sorted(set(targets))
        seqs = prompts.clone()
        out: list[Any] = [None] * prompts.shape[0]
        done = 0
        alive = list(range(prompts.shape[0]))
        cur = seqs
        with torch.no_grad():
            for L in stages:
                new = L - done
                res = self.rollout.generate(input_ids=cur, attention_mask=torch.ones_like(cur),
                                            max_new_tokens=new, min_new_tokens=new,
                                            do_sample=False, pad_token_id=0)
                done = L
                keep = []
                for j, i in enumerate(alive):
                    if targets[i] == L:
                        out[i] = res[j, prompts.shape[1]:]
                    else:
                        keep.append(j)
                alive = [alive[j] for j in keep]
                if not alive:
                    break
                cur = res[keep]
        width = max(targets)
        resp = torch.zeros(prompts.shape[0], width, dtype=prompts.dtype, device=self.dev)
        for i, r in enumerate(out):
            resp[i, :r.shape[0]] = r
        return resp, targets

    def log_probs(self, model: Any, seqs: Any, micro: int, grad: bool = False) -> Any:
        """Per-token log-probabilities of ``seqs`` under ``model``, in micro-batches."""
        torch = self.torch
        outs = []
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            for b in range(0, seqs.shape[0], micro):
                x = seqs[b:b + micro]
                logits = model(input_ids=x).logits[:, :-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).squeeze(-1)
                outs.append(lp)
        return torch.cat(outs)

    def update_actor(self, seqs: Any, adv: Any, step: int, micro: int) -> float:
        """PPO-style policy-gradient update through DDP (gradient all-reduce over NCCL)."""
        torch = self.torch
        self.actor.train()
        n = seqs.shape[0]
        mbs = list(range(0, n, micro))
        loss_sum = 0.0
        if self.scn.name == "memory_creep" and active(self.scn, step) and self.rank == 0:
            # memory kept every step, never freed: a leak that grows toward capacity
            nbytes = int(self.args.creep_gib * (1 << 30))
            self.hoard.append(torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.dev))
            self.hoard[-1].fill_(1)
        if self.scn.name == "oom" and active(self.scn, step) and self.rank == 0:
            # memory that is never given back: real allocations until CUDA says no
            nbytes = int(self.args.oom_gib * (1 << 30))
            self.hoard.append(torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.dev))
            self.hoard[-1].fill_(1)
        straggle = (self.scn.name == "straggler" and active(self.scn, step)
                    and self.rank == self.fault_rank)
        for k, b in enumerate(mbs):
            x = seqs[b:b + micro]
            last = k == len(mbs) - 1
            if straggle:
                # 2.5x the work on this rank only: the micro-batch's forward and backward once
                # more, and a forward alone, outside DDP's gradient sync (no extra communication)
                with self.actor.no_sync():
                    self.actor(input_ids=x).logits[:, :-1].float().mean().backward()
                    with torch.no_grad():
                        self.actor(input_ids=x)
            if self.scn.name == "nccl_hang" and active(self.scn, step) and last \
                    and self.rank == self.fault_rank:
                # this rank stops answering: its peers sit in the gradient all-reduce until the
                # process group's timeout, and NCCL's watchdog ends the job
                time.sleep(self.args.pg_timeout_s * 3)
            ctx = self.actor.no_sync() if not last else _null()
            with ctx:
                logits = self.actor(input_ids=x).logits[:, :-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).squeeze(-1)
                loss = -(adv[b:b + micro, None] * lp).mean() / len(mbs)
                loss.backward()
            loss_sum += float(loss.detach())
        if self.coll_reps and active(self.scn, step):
            for _ in range(self.coll_reps):
                self.dist.all_reduce(self.big)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss_sum

    def sync_weights(self, step: int) -> None:
        """Trainer weights into the rollout copy: broadcast through NCCL from rank 0."""
        torch = self.torch
        slow = self.scn.name == "slow_sync" and active(self.scn, step)
        src = dict(self.actor.module.named_parameters())
        with torch.no_grad():
            for name, p in self.rollout.named_parameters():
                t = src[name].detach()
                if slow:
                    # the slow path: each tensor through pageable host memory, in fp32
                    t = t.to("cpu", torch.float32).to(self.dev).to(p.dtype)
                buf = t.contiguous().clone()
                self.dist.broadcast(buf, src=0)
                p.copy_(buf)

    def hog_start(self) -> None:
        """A second process competing for this rank's GPU (bf16 matmuls in a loop)."""
        if self.dev.type != "cuda" or self.hog is not None:
            return
        code = ("import torch,time\n"
                "a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)\n"
                "while True:\n"
                "    for _ in range(20): a@a\n"
                "    torch.cuda.synchronize()\n")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(self.rank))
        self.hog = subprocess.Popen([sys.executable, "-c", code], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def hog_stop(self) -> None:
        if self.hog is not None:
            self.hog.kill()
            self.hog.wait()
            self.hog = None


@contextmanager
def _null():
    yield


def _stats(prefix: str, vals: list[float]) -> dict[str, float]:
    return {f"{prefix}/mean": float(sum(vals) / len(vals)), f"{prefix}/max": float(max(vals)),
            f"{prefix}/min": float(min(vals))}


def _slow_score(responses: list[list[int]], seconds: float) -> list[float]:
    """A reward function that is all Python: an edit distance of each response against a
    reference, repeated until about ``seconds`` of one core are spent."""
    t_end = time.perf_counter() + seconds
    ref = list(range(64))
    scores = [0.0] * len(responses)
    while time.perf_counter() < t_end:
        for i, r in enumerate(responses):
            a, b = r[:64], ref
            prev = list(range(len(b) + 1))
            for x in a:
                cur = [prev[0] + 1]
                for j, y in enumerate(b):
                    cur.append(min(prev[j + 1] + 1, cur[j] + 1, prev[j] + (x % 64 != y)))
                prev = cur
            scores[i] = 1.0 - prev[-1] / 128.0
            if time.perf_counter() >= t_end:
                break
    return scores


def run_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    """The whole job on one rank; rank 0 also fetches batches and prints the log."""
    import torch
    from torch.utils.data import DataLoader

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    w = Worker(rank, world, args)
    scn = w.scn
    per_rank = args.batch
    data = PromptData(per_rank * world * (args.steps + 1), args.prompt_len, args.vocab,
                      per_rank, world, scn, args.stall_s)
    loader = iter(DataLoader(data, batch_size=per_rank * world, num_workers=0)) \
        if rank == 0 else None
    jsonl = open(args.jsonl, "w") if (rank == 0 and args.jsonl) else None  # noqa: SIM115
    if rank == 0:
        print(PREFIX.format(pid=os.getpid()) + f"verl-shaped job: scenario={scn.name} "
              f"world={world} params={w.n_params/1e9:.2f}B batch/rank={per_rank}", flush=True)
    for step in range(1, args.steps + 1):
        # -- before the step timer: the next batch (verl: `for batch_dict in dataloader`)
        if rank == 0:
            batch = next(loader).to(w.dev)
        else:
            batch = torch.empty(per_rank * world, args.prompt_len, dtype=torch.long, device=w.dev)
        w.dist.broadcast(batch, src=0)
        prompts = batch[rank * per_rank:(rank + 1) * per_rank]
        if scn.name == "contention" and rank == w.fault_rank:
            if active(scn, step):
                w.hog_start()
            else:
                w.hog_stop()
        timing: dict[str, float] = {}
        t_step = time.perf_counter()

        def mark(name: str, t0: float, timing: dict[str, float] = timing) -> float:
            w.sync()
            t1 = time.perf_counter()
            timing[name] = t1 - t0
            return t1

        t = time.perf_counter()
        resp, lens = w.generate(prompts, step)
        t = mark("gen", t)
        seqs = torch.cat([prompts, resp], 1)
        # reward: rule-based, on the CPU
        rewards = torch.tensor([(int(s) % 7) / 7.0 for s in resp[:, 0].tolist()])
        if scn.name == "cpu_reward" and active(scn, step):
            rewards = torch.tensor(_slow_score(resp.tolist(), args.reward_s))
        t = mark("reward", t)
        micro = 1 if (scn.name == "tiny_micro" and active(scn, step)) else args.micro
        offload = scn.name == "offload" and active(scn, step)
        if offload:
            w.offload_round_trip()
        old_lp = w.log_probs(w.actor.module, seqs, micro)
        t = mark("old_log_prob", t)
        if offload:
            w.offload_round_trip()
        ref_lp = w.log_probs(w.ref, seqs, micro)
        t = mark("ref", t)
        # adv: group-normalised advantages (GRPO) on the driver's CPU
        adv_cpu = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        kl = float((old_lp - ref_lp).mean())
        adv = adv_cpu.to(w.dev, torch.float32)
        t = mark("adv", t)
        loss = w.update_actor(seqs, adv, step, micro)
        t = mark("update_actor", t)
        w.sync_weights(step)
        t = mark("update_weights", t)
        timing["step"] = t - t_step
        # token counts over all ranks
        toks = torch.tensor([float(seqs.numel()), float(sum(lens))], device=w.dev)
        all_toks = [torch.zeros_like(toks) for _ in range(world)]
        w.dist.all_gather(all_toks, toks)
        all_lens = [torch.zeros(per_rank, device=w.dev) for _ in range(world)]
        w.dist.all_gather(all_lens, torch.tensor(lens, device=w.dev, dtype=torch.float32))
        if rank != 0:
            continue
        rl = torch.cat(all_lens).tolist()
        seqlen = [float(x[0]) for x in all_toks]
        total_tokens = sum(seqlen)
        mem_alloc = (torch.cuda.max_memory_allocated(w.dev) / 2**30) if w.dev.type == "cuda" else 0.0
        mem_res = (torch.cuda.max_memory_reserved(w.dev) / 2**30) if w.dev.type == "cuda" else 0.0
        metrics: dict[str, float] = {
            "training/global_step": step, "training/epoch": 0,
            "actor/pg_loss": loss, "actor/ppo_kl": kl, "actor/lr": 1e-6,
            "critic/score/mean": float(rewards.mean()), "critic/rewards/mean": float(rewards.mean()),
            "critic/advantages/mean": float(adv_cpu.mean()),
            **_stats("response_length", rl),
            "response_length/clip_ratio": float(sum(1 for x in rl if x >= args.tail_len) / len(rl)),
            "prompt_length/mean": float(args.prompt_len),
            **{f"timing_s/{k}": v for k, v in timing.items()},
            "perf/total_num_tokens": int(total_tokens),
            "perf/time_per_step": timing["step"],
            "perf/throughput": total_tokens / timing["step"] / world,
            "perf/max_memory_allocated_gb": mem_alloc,
            "perf/max_memory_reserved_gb": mem_res,
            "global_seqlen/min": min(seqlen), "global_seqlen/max": max(seqlen),
            "global_seqlen/minmax_diff": max(seqlen) - min(seqlen),
            "global_seqlen/mean": total_tokens / world,
        }
        print(format_step_line(step, metrics), flush=True)
        if jsonl is not None:
            jsonl.write(json.dumps({"step": step, "data": metrics}) + "\n")
            jsonl.flush()
    w.hog_stop()
    if rank == 0:
        print(PREFIX.format(pid=os.getpid()) + "Training finished.", flush=True)
    w.dist.destroy_process_group()


def _spawn_entry(rank: int, world: int, args: argparse.Namespace) -> None:
    run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        args.hidden, args.layers, args.vocab = min(args.hidden, 64), min(args.layers, 2), 512
        args.batch, args.prompt_len, args.micro = min(args.batch, 4), 16, 2
        args.resp_lens, args.tail_len = "4,6,8", 12
        args.stall_s = min(args.stall_s, 1.0)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_NCCL_ENABLE_MONITORING", "0")
    if args.gpus == 1:
        run_rank(0, 1, args)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_spawn_entry, args=(args.gpus, args), nprocs=args.gpus, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
