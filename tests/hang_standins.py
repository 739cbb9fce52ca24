"""Test scaffolding for the hang tests: real dumps, and stand-in ranks that answer a FIFO.

A stand-in rank is a real process that does what a torch rank does with
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: it creates ``<dir>/pipe_<rank>.pipe``, watches it, and
when a byte arrives writes its dump to ``<dir>/fr_<rank>`` (here: a dump given to it).
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "real_gpu" / "fr_1gpu"

STANDIN = r"""
import os, sys, time
directory, rank, dump_path, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
pipe = os.path.join(directory, f"pipe_{rank}.pipe")
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    try:
        data = os.read(fd, 16)
    except BlockingIOError:
        data = b""
    if data:
        time.sleep(delay)
        tmp = os.path.join(directory, f"fr_{rank}.tmp")
        with open(dump_path, "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.replace(tmp, os.path.join(directory, f"fr_{rank}"))
    time.sleep(0.02)
"""


def real_dump(name: str = "stuck_kernel") -> dict:
    """The recorded H200 dump ``name`` (running, stuck_kernel) as plain data."""
    with open(FIXTURES / name / "fr_0", "rb") as fh:
        return pickle.load(fh)


def as_rank(dump: dict, rank: int, world: int, drop_after: int | None = None) -> dict:
    """The real dump rewritten as rank ``rank`` of ``world``: entries after ``drop_after`` are
    removed (the rank never issued them) and the statuses follow."""
    d = copy.deepcopy(dump)
    for cfg in d["pg_config"].values():
        cfg["ranks"] = str(list(range(world)))
    if drop_after is not None:
        d["entries"] = [e for e in d["entries"] if e["collective_seq_id"] <= drop_after]
        for st in d["pg_status"].values():
            st["last_enqueued_collective"] = min(st["last_enqueued_collective"], drop_after)
            st["last_completed_collective"] = min(st["last_completed_collective"], drop_after)
    return d


def write_dump(path: Path, dump: dict) -> Path:
    """Pickle ``dump`` to ``path``."""
    path.write_bytes(pickle.dumps(dump))
    return path


def start_standin(directory: Path, rank: int, dump_path: Path, delay: float = 0.2
                  ) -> subprocess.Popen:
    """A process that answers ``pipe_<rank>.pipe`` by writing ``dump_path`` as ``fr_<rank>``."""
    p = subprocess.Popen([sys.executable, "-c", STANDIN, str(directory), str(rank),
                          str(dump_path), str(delay)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while not (directory / f"pipe_{rank}.pipe").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return p


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill the stand-ins."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout:
            p.stdout.close()


__all__ = ["FIXTURES", "as_rank", "real_dump", "start_standin", "stop", "write_dump", "os"]


# ---------------------------------------------------------------------------- verl-shaped jobs
#: A job tree laid out as verl's own files are (verl/trainer/ppo/ray_trainer.py, ...), with
#: stand-ins for the libraries the box lacks (ray, torch.utils.data): real processes running
#: real Python in those files, so py-spy prints what it prints on a verl job.
JOB_FILES: dict[str, str] = {
    "ray/_private/worker.py": '''
import threading, time
_never = threading.Event()
def get(refs, timeout=None):
    end = None if timeout is None else time.monotonic() + timeout
    while not _never.wait(0.5):
        if end is not None and time.monotonic() > end:
            return refs
def main_loop(task):
    task()
    while True:
        time.sleep(0.5)
''',
    "verl/single_controller/ray/base.py": '''
from ray._private import worker
def execute_all(method_name, *args, timeout=None):
    return worker.get([method_name], timeout=timeout)
class RayWorkerGroup:
    def generate_sequences(self, batch, timeout=None):
        return execute_all("generate_sequences", batch, timeout=timeout)
''',
    "verl/workers/reward_manager/naive.py": '''
class NaiveRewardManager:
    def __init__(self, compute_score):
        self.compute_score = compute_score
    def __call__(self, data):
        return [self.compute_score("gsm8k", s, "42", {}) for s in data]
''',
    "verl/trainer/ppo/reward.py": '''
def compute_reward(data, reward_fn):
    return reward_fn(data)
''',
    "torch/utils/data/dataloader.py": '''
class _SingleProcessDataLoaderIter:
    def __init__(self, dataset):
        self.dataset, self.i = dataset, 0
    def _next_data(self):
        self.i += 1
        return self.dataset[self.i]
    def __next__(self):
        return self._next_data()
class _MultiProcessingDataLoaderIter:
    def __init__(self, dataset):
        import multiprocessing as mp
        from torch.utils.data._utils.worker import _worker_loop
        ctx = mp.get_context("fork")
        self.index_queue, self.data_queue, self.i = ctx.Queue(), ctx.Queue(), 0
        self.worker = ctx.Process(target=_worker_loop, daemon=True,
                                  args=(dataset, self.index_queue, self.data_queue))
        self.worker.start()
    def _next_data(self):
        self.i += 1
        self.index_queue.put(self.i)
        return self.data_queue.get()
    def __next__(self):
        return self._next_data()
class DataLoader:
    def __init__(self, dataset, num_workers=0):
        self.dataset, self.num_workers = dataset, num_workers
    def __iter__(self):
        if self.num_workers:
            return _MultiProcessingDataLoaderIter(self.dataset)
        return _SingleProcessDataLoaderIter(self.dataset)
''',
    "torch/utils/data/_utils/worker.py": '''
def _worker_loop(dataset, index_queue, data_queue):
    while True:
        data_queue.put(dataset[index_queue.get()])
''',
    "verl/trainer/ppo/ray_trainer.py": '''
from torch.utils.data.dataloader import DataLoader
from verl.trainer.ppo.reward import compute_reward
class RayPPOTrainer:
    def __init__(self, dataset, reward_fn, wg, num_workers=0):
        self.train_dataloader = DataLoader(dataset, num_workers)
        self.reward_fn, self.actor_rollout_wg = reward_fn, wg
    def fit(self, steps, log, case="", pause_s=0.0):
        it = iter(self.train_dataloader)
        for step in range(1, 10**6):
            batch = next(it)
            gen_batch_output = self.actor_rollout_wg.generate_sequences(batch)
            compute_reward([batch, gen_batch_output], self.reward_fn)
            if step == steps and case == "validate":
                self._validate(pause_s)
            if step == steps and case == "ckpt":
                self._save_checkpoint(pause_s)
            log(step)
    def _validate(self, pause_s):
        from verl.single_controller.ray.base import RayWorkerGroup
        return RayWorkerGroup().generate_sequences(None, timeout=pause_s)
    def _save_checkpoint(self, pause_s):
        from verl.utils.checkpoint.checkpoint_manager import save_checkpoint
        save_checkpoint(pause_s)
''',
    "verl/utils/checkpoint/checkpoint_manager.py": '''
from torch.serialization import save
def save_checkpoint(pause_s):
    save({"w": 1}, "/dev/null", pause_s)
''',
    "torch/serialization.py": '''
import time
def save(obj, path, pause_s):
    end = time.monotonic() + pause_s
    while time.monotonic() < end:
        with open(path, "wb") as fh:
            fh.write(b"x" * 4096)
        time.sleep(0.01)
''',
    "vllm/entrypoints/llm.py": '''
class LLM:
    def generate(self):
        while True:
            sum(range(10000))
''',
    "verl/workers/fsdp_workers.py": '''
import threading
class ActorRolloutRefWorker:
    def generate_sequences(self, prompts):
        threading.Event().wait()
    def generate_in_engine(self):
        from vllm.entrypoints.llm import LLM
        LLM().generate()
''',
    "user_reward.py": '''
import re, requests
URL = None
def normalize_final_answer(answer):
    while True:
        answer = re.sub(r"(\\\\s)+", " ", answer + " x")[-200:]
def _stuck_in_verifier(answer):
    import time
    time.sleep(3600)
def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "sleep":
        return _stuck_in_verifier(solution_str)
    if URL:
        return requests.post(URL, json={"s": solution_str}).json()["score"]
    if solution_str == "hang":
        return normalize_final_answer(solution_str)
    return 1.0
''',
    "user_dataset.py": '''
import os, threading
class BlockingDataset:
    def __init__(self, block_at):
        self.block_at = block_at
    def __getitem__(self, i):
        if i >= self.block_at:
            parent = os.getppid()
            while os.getppid() == parent:  # a forked loader worker ends with its driver
                threading.Event().wait(0.5)
            raise SystemExit(0)
        return "ok"
''',
    "job.py": '''
import os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
case, log_path, steps, step_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
import user_reward
from user_dataset import BlockingDataset
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.reward_manager.naive import NaiveRewardManager
class LocalGroup:
    def __init__(self):
        self.calls = 0
    def generate_sequences(self, batch):
        self.calls += 1
        if case == "worker" and self.calls > steps:
            from verl.single_controller.ray.base import RayWorkerGroup
            return RayWorkerGroup().generate_sequences(batch)
        time.sleep(step_s)
        if self.calls > steps and case in ("reward", "reward_sleep"):
            return "hang" if case == "reward" else "sleep"
        return "fine"
def log(step):
    with open(log_path, "a") as fh:
        fh.write(f"(TaskRunner pid={os.getpid()}) step:{step} - timing_s/step:{step_s:.3f}"
                 f" - timing_s/gen:{step_s:.3f} - timing_s/reward:0.010\\n")
    if case == "http" and step == steps:
        user_reward.URL = sys.argv[5]
    if case == "none" and step == steps:
        os._exit(0)
trainer = RayPPOTrainer(BlockingDataset(steps + 1 if case in ("data", "data_mp") else 10**9),
                        NaiveRewardManager(user_reward.compute_score), LocalGroup(),
                        num_workers=1 if case == "data_mp" else 0)
print("ready", flush=True)
trainer.fit(steps, log, case, float(sys.argv[6]) if len(sys.argv) > 6 else 0.0)
''',
    "ray/_private/workers/default_worker.py": '''
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) + "/../../..")
from ray._private.worker import main_loop
from verl.workers.fsdp_workers import ActorRolloutRefWorker
log_path = sys.argv[1]
with open(log_path, "a") as fh:
    fh.write(f"(WorkerDict pid={os.getpid()}, ip=127.0.0.1) init done\\n")
print("ready", flush=True)
def task():
    if sys.argv[2] == "busy":
        ActorRolloutRefWorker().generate_sequences(None)
    elif sys.argv[2] == "gen":
        ActorRolloutRefWorker().generate_in_engine()
main_loop(task)
''',
}


def write_job_tree(root: Path) -> Path:
    """Lay out the verl-shaped job under ``root``; returns ``root``."""
    for rel, text in JOB_FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    for pkg in ("ray", "ray/_private", "ray/_private/workers", "verl", "verl/single_controller",
                "verl/single_controller/ray", "verl/workers", "verl/workers/reward_manager",
                "verl/trainer", "verl/trainer/ppo", "torch", "torch/utils", "torch/utils/data", "torch/utils/data/_utils",
                "verl/utils", "verl/utils/checkpoint", "vllm", "vllm/entrypoints"):
        (root / pkg / "__init__.py").touch()
    return root


def start_job(root: Path, case: str, log: Path, steps: int = 3, step_s: float = 0.5,
              url: str = "", title: str = "ray::TaskRunner.run", pause_s: float = 0.0
              ) -> subprocess.Popen:
    """The driver stand-in: ``steps`` healthy steps logged as ``(TaskRunner pid=N) step:..``,
    then stuck as ``case`` says (reward: a compute_score loop; http: compute_score waits on
    ``url``; data: the dataset's __getitem__ blocks; worker: a worker-group call never
    returns; validate / ckpt: a healthy validation or checkpoint of ``pause_s`` after the
    last of ``steps``, then steps go on). Its process title reads like Ray's (``title``)."""
    p = subprocess.Popen([title, str(root / "job.py"), case, str(log), str(steps), str(step_s),
                          url or "-", str(pause_s)], executable=sys.executable,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def start_worker(root: Path, log: Path, busy: bool | str = True,
                 title: str = "ray::WorkerDict.actor_rollout_generate_sequences"
                 ) -> subprocess.Popen:
    """A worker stand-in: Ray's task loop running a method that never returns (``busy``),
    generating in a (stand-in) vLLM engine (``busy="gen"``), or idle in the task loop; it logs
    ``(WorkerDict pid=N, ip=127.0.0.1)`` once."""
    mode = busy if isinstance(busy, str) else ("busy" if busy else "idle")
    p = subprocess.Popen([title, str(root / "ray/_private/workers/default_worker.py"), str(log),
                          mode],
                         executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


# ---------------------------------------------------------------------------- process trees
#: A parent that starts each argv of its JSON argument under itself (argv[0]: the child's
#: title), prints their PIDs as one JSON line, and waits: Ray's raylet (its command line
#: starting with ``.../raylet``), ``verl-monitor run``, or another user's session.
LAUNCHER = r"""
import json, subprocess, sys, time
kids = [subprocess.Popen(a, executable=sys.argv[2], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL) for a in json.loads(sys.argv[1])]
print(json.dumps([k.pid for k in kids]), flush=True)
while True:
    time.sleep(1)
"""
#: A Python process that only sleeps (its argv[0] is its title).
SLEEP = ["-c", "import time\ndef OTHER_JOB_PRIVATE_FUNCTION():\n    time.sleep(120)\n"
         "OTHER_JOB_PRIVATE_FUNCTION()\n"]


#: A Python another user may run (this venv's may sit under a folder only we can enter).
OTHER_USERS_PYTHON = "/usr/bin/python3"


def job_argv(root: Path, case: str, log: Path, steps: int = 3, step_s: float = 0.5,
             title: str = "ray::TaskRunner.run") -> list[str]:
    """The driver stand-in's command line (see :func:`start_job`), to start under a tree."""
    return [title, str(root / "job.py"), case, str(log), str(steps), str(step_s), "-", "0"]


def worker_argv(root: Path, log: Path, mode: str = "idle",
                title: str = "ray::WorkerDict") -> list[str]:
    """A worker stand-in's command line (see :func:`start_worker`)."""
    return [title, str(root / "ray/_private/workers/default_worker.py"), str(log), mode]


def start_tree(argvs: list[list[str]], argv0: str = "python3", user: int | None = None
               ) -> tuple[subprocess.Popen, list[int]]:
    """A parent whose command line starts with ``argv0`` running each argv under itself (as
    ``user`` in a session of its own when given); returns it and its children's PIDs."""
    import json

    python = sys.executable if user is None else OTHER_USERS_PYTHON
    p = subprocess.Popen([argv0, "-c", LAUNCHER, json.dumps(argvs), python],
                         executable=python,
                         stdout=subprocess.PIPE, text=True, user=user,
                         start_new_session=user is not None)
    assert p.stdout is not None
    return p, json.loads(p.stdout.readline())


def stop_tree(parent: subprocess.Popen, pids: list[int]) -> None:
    """End a tree this test started: its children by their PIDs, then the parent."""
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    stop([parent])
