"""Where a job's process is, from py-spy's text: the pure classifier behind the ``hang`` flag.

``py-spy dump --pid P`` prints a header (``Process P: <title or command line>``) and every
thread's stack, innermost frame first, with file names shortened to the package part::

    Process 17216: ray::TaskRunner.run /job/main.py ...
    Thread 17216 (active+gil): "MainThread"
        sub (re/__init__.py:185)
        normalize_final_answer (user_reward.py:5)
        compute_score (user_reward.py:10)
        NaiveRewardManager.__call__ (verl/workers/reward_manager/naive.py:5)
        RayPPOTrainer.fit (verl/trainer/ppo/ray_trainer.py:12)

:func:`classify` reads one such dump into a :class:`Where`: the place (what the process is
doing: scoring rewards, waiting on a worker-group call, on an HTTP answer, in the data loader,
a replay buffer, checkpoint I/O, validation; for workers: idle in Ray's task loop, in a
collective, in a kernel, running a method), the phase it maps to, and the deepest frame in the
user's or verl's own code (library and standard-library frames skipped, verl's kept).
:func:`judge` compares the processes of one node and says whether the job is stuck and where;
given the job's processes that are gone (:func:`gone_where`: killed or crashed after the last
step), it names them while the others wait in a collective.
No I/O here: the exporter runs py-spy (``monitor.hang.pyspy``) and passes the text.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from monitor.hang.dump import Frame

_HEADER = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<state>[^)]*)\)(?::\s*"(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s+(?P<name>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")

#: Top-level packages that are libraries, not the user's or verl's code.
LIBRARIES: frozenset[str] = frozenset((
    "ray", "torch", "vllm", "sglang", "requests", "urllib3", "httpx", "httpcore", "aiohttp",
    "anyio", "transformers", "tensordict", "numpy", "pandas", "datasets", "accelerate",
    "safetensors", "tqdm", "hydra", "omegaconf", "grpc", "uvloop", "tokenizers", "megatron",
    "flash_attn", "triton", "torchdata", "pyarrow", "math_verify", "sympy", "latex2sympy2",
    "codetiming", "wandb", "zmq", "msgspec", "fastapi", "starlette", "uvicorn", "h11",
    "psutil", "setproctitle", "site-packages", "dist-packages", "<frozen", "py-spy"))
_STDLIB: frozenset[str] = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "threading", "socket", "selectors", "ssl", "asyncio", "concurrent", "queue", "subprocess",
    "multiprocessing", "http", "urllib", "re", "json", "time", "logging", "signal", "runpy"}

# ---------------------------------------------------------------------------- places
#: Places, by what the process does; ``STUCK`` ones make a silence a hang at once.
REWARD, WORKER_CALL, HTTP, REPLAY, DATALOADER, CHECKPOINT, VALIDATION = (
    "reward", "worker_call", "http", "replay_buffer", "dataloader", "checkpoint", "validation")
GENERATION, COLLECTIVE, KERNEL, RAY_IDLE, METHOD, UNKNOWN = (
    "generation", "collective", "kernel", "ray_idle", "method", "unknown")
LOADER_IDLE = "loader_idle"  # a data loader worker waiting for its next index
#: A process of the job that was alive in the silence and is gone (killed or crashed).
GONE = "gone"
#: The role of a data loader's worker process (forked from the driver: the same Ray title).
LOADER_WORKER = "data loader worker"
STUCK: frozenset[str] = frozenset((REWARD, HTTP, REPLAY, DATALOADER, WORKER_CALL, METHOD,
                                   GONE))
#: Places of a long but healthy phase: quiet until ``stalled``'s longer limit.
LONG_PHASES: frozenset[str] = frozenset((CHECKPOINT, VALIDATION, GENERATION, KERNEL))

_REWARD_NAMES = re.compile(r"(^|\.)(compute_score|default_compute_score|compute_reward|"
                           r"compute_reward_async|_compute_reward_colocate|compute_rm_score|"
                           r"run_single|extract_output|verify|reward_fn)$")
_REWARD_FILES = ("reward_manager", "reward_loop", "reward_score", "/reward.py")
_HTTP_FILES = ("httpx/", "httpcore/", "aiohttp/", "requests/", "urllib3/", "http/client.py",
               "urllib/request.py")
_HTTP_LEAF = re.compile(r"(recv|recv_into|readinto|read|readline|_read_status|getresponse|"
                        r"select|poll|wait_for|_receive_event|read_response)$")
_REPLAY = re.compile(r"(replay_buffer|replaybuffer|transfer_queue|transferqueue|"
                     r"message_queue|messagequeue)", re.I)
_DATA = re.compile(r"(torch/utils/data/|stateful_dataloader|torchdata/)")
_DATA_NAMES = re.compile(r"(^|\.)(_next_data|_get_data|_next_index|fetch)$")
_CKPT_NAMES = re.compile(r"(^|\.)(save_checkpoint|_save_checkpoint|save_pretrained|save_file|"
                         r"_save|save|_write_file|write_file|async_save)$")
_CKPT_FILES = ("checkpoint", "torch/serialization.py", "safetensors", "torch/distributed/"
               "checkpoint")
_COLLECTIVE = re.compile(r"(^|\.)(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|"
                         r"barrier|monitored_barrier|all_to_all\w*|reduce|gather|scatter|send|"
                         r"recv|isend|irecv|_allgather_base|_reduce_scatter_base|wait)$")
_KERNEL = re.compile(r"(^|\.)(synchronize|item|tolist|cpu|wait_stream|_local_scalar_dense)$")
_GEN_FILES = ("vllm/", "sglang/", "verl/workers/rollout/")
_WG_FILES = ("verl/single_controller/",)
_RAY_GET = re.compile(r"(^|\.)(get|get_objects|wait)$")
#: Libraries whose innermost frame means the process computes (on the GPU, mostly).
_COMPUTE = frozenset(("torch", "vllm", "sglang", "triton", "flash_attn", "megatron",
                      "transformers", "tensordict"))
_TITLE = re.compile(r"^ray::(?P<cls>[A-Za-z_]\w*)(?:\.(?P<method>[A-Za-z_]\w*))?")

#: verl worker-group methods -> the phase they run.
METHOD_PHASES: dict[str, str] = {
    "generate_sequences": "gen", "compute_log_prob": "old_log_prob",
    "compute_ref_log_prob": "ref", "compute_values": "values", "update_actor": "update_actor",
    "update_critic": "update_critic", "compute_rm_score": "reward",
    "save_checkpoint": "save_checkpoint", "update_weights": "reshard", "sync_weights": "reshard"}
#: Actor classes by role.
ROLES: dict[str, str] = {
    "TaskRunner": "driver", "TaskRunnerV1": "driver", "main_task": "driver",
    "FullyAsyncTrainer": "trainer", "FullyAsyncRollouter": "rollouter",
    "SeparateAsyncTrainer": "trainer", "WorkerDict": "worker", "RewardLoopWorker": "reward",
    "AgentLoopWorker": "agent_loop", "MessageQueue": "queue", "ReplayBuffer": "queue",
    "Launcher": "launcher", "DataLoaderWorker": LOADER_WORKER}


@dataclass(frozen=True)
class Thread:
    """One thread's frames, innermost first."""

    tid: str
    name: str
    active: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Dump:
    """One py-spy dump: the process and its threads."""

    pid: int | None
    title: str
    threads: tuple[Thread, ...]


@dataclass(frozen=True)
class Where:
    """Where one process is (``place`` from the constants above)."""

    pid: int | None
    role: str
    place: str
    phase: str = ""
    frame: Frame | None = None  # the deepest frame in the user's or verl's own code
    detail: str = ""  # e.g. the worker-group method, "an HTTP answer (requests)"
    node: str = ""
    thread: str = ""
    gpu: int | None = None  # the GPU it held, when known (a gone process: from the last look)
    rank: int | None = None  # its rank, when known (the Flight Recorder FIFO it read)

    @property
    def stuck(self) -> bool:
        """True for a place that means the job cannot go on by itself."""
        return self.place in STUCK

    def describe(self) -> str:
        """One clause: who (role or rank, PID, GPU, node), what it does, and its frame."""
        return describe_where(self.role, self.pid, self.node, self.place, self.phase,
                              "" if self.frame is None else str(self.frame), self.detail,
                              gpu=self.gpu, rank=self.rank)

    def to_dict(self) -> dict:
        """Plain data for an event."""
        return {"pid": self.pid, "role": self.role, "place": self.place, "phase": self.phase,
                "frame": str(self.frame) if self.frame else "", "detail": self.detail,
                "node": self.node, "stuck": self.stuck, "gpu": self.gpu, "rank": self.rank}


def gone_where(pid: int, role: str = "", node: str = "", exited_after: float | None = None,
               gpu: int | None = None, rank: int | None = None) -> Where:
    """A process of the job that is gone, as a ``Where`` (place ``gone``): ``exited_after`` is
    how many seconds after the last step it was last seen alive, when known."""
    when = (f"it exited {max(exited_after, 0.0):.0f} s after the last step"
            if exited_after is not None else "it exited after the last step")
    return Where(pid, role, GONE, detail=f": {when} (killed or crashed)", node=node, gpu=gpu,
                 rank=rank)


PLACE_WORDS: dict[str, str] = {
    REWARD: "is scoring rewards", WORKER_CALL: "waits on a worker-group call",
    HTTP: "waits for an HTTP answer", REPLAY: "waits in a replay buffer / transfer queue",
    DATALOADER: "waits in the data loader", CHECKPOINT: "is in checkpoint I/O",
    VALIDATION: "is validating", GENERATION: "is generating", COLLECTIVE: "waits in a collective",
    KERNEL: "computes or waits on its GPU (in a kernel)", RAY_IDLE: "is idle in Ray's task loop",
    METHOD: "runs a worker method that does not return", UNKNOWN: "is somewhere unrecognised",
    LOADER_IDLE: "waits for its next index", GONE: "is gone"}


def parse(text: str) -> Dump:
    """Every thread of one py-spy text dump (a header-less dump has pid None)."""
    pid, title = None, ""
    threads: list[Thread] = []
    cur: list[Frame] | None = None
    meta: tuple[str, str, bool] = ("", "", False)
    for line in text.splitlines():
        h = _HEADER.match(line)
        if h:
            pid, title = int(h.group("pid")), h.group("cmd").strip()
            continue
        t = _THREAD.match(line)
        if t:
            if cur is not None:
                threads.append(Thread(meta[0], meta[1], meta[2], tuple(cur)))
            cur = []
            meta = (t.group("tid"), t.group("name") or "", "active" in t.group("state"))
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur.append(Frame(m.group("name"), m.group("file"), int(m.group("line"))))
    if cur is not None:
        threads.append(Thread(meta[0], meta[1], meta[2], tuple(cur)))
    return Dump(pid, title, tuple(threads))


def role_of(title: str, fallback: str = "") -> tuple[str, str]:
    """(role, running method) from a Ray process title (``ray::WorkerDict.generate_sequences``)."""
    m = _TITLE.match(title.strip())
    if not m:
        return fallback, ""
    cls = m.group("cls")
    method = m.group("method") or ""
    if cls == "IDLE":
        return "idle", ""
    return ROLES.get(cls, cls), method if method not in ("run", "__init__") else ""


_PREFIX = re.compile(r"^.*(?:site-packages|dist-packages)/|^.*/lib/python3(?:\.\d+)?/")


def _top(filename: str) -> str:
    """The top-level package of a frame's file (py-spy's short names, or full paths)."""
    name = _PREFIX.sub("", filename.replace("\\", "/")).lstrip("./")
    if name.startswith("<"):
        return "<frozen"
    first = name.split("/", 1)[0]
    return first[:-3] if first.endswith(".py") else first


def is_own(frame: Frame) -> bool:
    """True for a frame in the user's or verl's code (not a library or the standard library)."""
    path = frame.filename.replace("\\", "/")
    if "verl" in path.split("/")[:-1]:
        return True
    if "site-packages/" in path or "dist-packages/" in path or "/lib/python3" in path:
        return False
    top = _top(path)
    return top not in LIBRARIES and top not in _STDLIB


def own_frame(frames: Sequence[Frame]) -> Frame | None:
    """The deepest (innermost) own frame, else the innermost frame."""
    for fr in frames:
        if is_own(fr):
            return fr
    return frames[0] if frames else None


def _method_phase(method: str) -> str:
    for key, phase in METHOD_PHASES.items():
        if method.endswith(key):
            return phase
    return ""


def _leaf(frames: Sequence[Frame]) -> str:
    """What the innermost frames block in: http, collective, kernel or ''."""
    for fr in frames[:6]:
        if any(p in fr.filename for p in _HTTP_FILES):
            return HTTP
        if _COLLECTIVE.search(fr.name) and "torch/distributed" in fr.filename:
            return COLLECTIVE
        if _KERNEL.search(fr.name) and ("torch/" in fr.filename or "cuda" in fr.filename):
            return KERNEL
    if frames and frames[0].filename.endswith("socket.py") and _HTTP_LEAF.search(frames[0].name):
        return HTTP
    return ""


def _context(frames: Sequence[Frame]) -> str:
    """The innermost recognised context of a thread (reward, data loader, ...), else ''."""
    for fr in frames:
        if _REPLAY.search(fr.name) or _REPLAY.search(fr.filename):
            return REPLAY
        if _DATA.search(fr.filename) or (_DATA_NAMES.search(fr.name) and "data" in fr.filename):
            return DATALOADER
        if _REWARD_NAMES.search(fr.name) or any(p in fr.filename for p in _REWARD_FILES):
            return REWARD
        if _CKPT_NAMES.search(fr.name) and (
                any(p in fr.filename for p in _CKPT_FILES) or "checkpoint" in fr.name):
            return CHECKPOINT
        if _is_ray_get(fr):  # waits for a remote call's result (a worker runs it)
            return WORKER_CALL
        if fr.name.endswith("_validate"):
            return VALIDATION
        if any(p in fr.filename for p in _GEN_FILES):
            return GENERATION
    return ""


def _is_ray_get(fr: Frame) -> bool:
    """``ray.get`` / ``ray.wait`` (Ray's worker.py), where a caller waits on remote work."""
    path = fr.filename.replace("\\", "/")
    return bool(_RAY_GET.search(fr.name)) and path.endswith("worker.py") and (
        path.startswith("ray/") or "/ray/" in path)


def _only_ray(frames: Sequence[Frame]) -> bool:
    return bool(frames) and all(_top(f.filename) in ("ray", "<frozen") or not is_own(f)
                                for f in frames) and any(_top(f.filename) == "ray"
                                                         for f in frames)


def classify_thread(frames: Sequence[Frame], method: str = "") -> tuple[str, str, str]:
    """(place, phase, detail) of one thread's frames (innermost first)."""
    leaf = _leaf(frames)
    ctx = _context(frames)
    in_validate = any(f.name.endswith("_validate") for f in frames)
    if ctx == REWARD:
        detail = "(compute_score waits for an HTTP answer)" if leaf == HTTP else ""
        return REWARD, "testing" if in_validate else "reward", detail
    if ctx in (REPLAY, DATALOADER, CHECKPOINT):
        return ctx, {CHECKPOINT: "save_checkpoint", REPLAY: "gen",
                     DATALOADER: "data_wait"}.get(ctx, ""), ""
    if leaf == HTTP:
        return HTTP, "gen", "(a rollout server or another service)"
    if leaf == COLLECTIVE:
        return COLLECTIVE, _method_phase(method), ""
    if ctx == WORKER_CALL:
        return WORKER_CALL, "testing" if in_validate else _method_phase(method), ""
    if ctx == VALIDATION:
        return VALIDATION, "testing", ""
    if leaf == KERNEL:
        return KERNEL, _method_phase(method), ""
    if ctx == GENERATION:
        return GENERATION, "gen", ""
    lib = next((f for f in frames if _top(f.filename) not in _STDLIB), None)
    if lib is not None and _top(lib.filename) in _COMPUTE:  # inside torch & co: computing
        return KERNEL, _method_phase(method), ""
    if _only_ray(frames):
        return RAY_IDLE, "", ""
    if method:
        return METHOD, _method_phase(method), f"({method})"
    return UNKNOWN, "", ""


_RANK = {REWARD: 9, DATALOADER: 9, REPLAY: 9, CHECKPOINT: 8, HTTP: 8, COLLECTIVE: 7,
         WORKER_CALL: 6, VALIDATION: 6, KERNEL: 5, GENERATION: 5, METHOD: 4, UNKNOWN: 2,
         RAY_IDLE: 1}


def classify(text: str, role: str = "", node: str = "", pid: int | None = None) -> Where:
    """Where the process of one py-spy dump is: its most telling thread's place and frame.

    ``role`` (driver, worker, ...) is taken from the Ray title in the dump's header when it
    has one; the main thread is preferred unless it only idles in Ray's loop."""
    dump = parse(text)
    role, method = role_of(dump.title, ROLES.get(role, role))
    pid = pid if pid is not None else dump.pid
    best: tuple[int, Where] | None = None
    for th in dump.threads:
        if not th.frames:
            continue
        place, phase, detail = classify_thread(th.frames, method)
        if place == WORKER_CALL and method:
            detail = detail or f"({method})"
        rank = _RANK.get(place, 0) + (1 if th.name == "MainThread" else 0)
        frames = th.frames
        if place == WORKER_CALL:  # the caller of the worker group, not its plumbing
            frames = tuple(f for f in frames if not any(p in f.filename for p in _WG_FILES))
        w = Where(pid, role, place, phase, own_frame(frames), detail, node, th.name)
        if best is None or rank > best[0]:
            best = (rank, w)
    if best is None:
        return Where(pid, role, UNKNOWN, node=node, detail="(py-spy printed no frame)")
    main = next((th for th in dump.threads if th.name == "MainThread"), None)
    loader = _loader_worker(main.frames if main is not None else ())
    return loader(best[1]) if loader is not None else best[1]


def _loader_worker(frames: Sequence[Frame]):
    """For a data loader's worker process (its stack runs ``_worker_loop``), a function that
    rewrites its ``Where``: in the dataset (an own frame inside the loop) or waiting for an
    index; None for any other process."""
    at = next((i for i, f in enumerate(frames)
               if f.name.endswith("_worker_loop") and "data" in f.filename), None)
    if at is None:
        return None
    inner = next((f for f in frames[:at] if is_own(f)), None)

    def rewrite(w: Where) -> Where:
        if inner is None:
            return Where(w.pid, LOADER_WORKER, LOADER_IDLE, "", frames[at], "", w.node, w.thread)
        return Where(w.pid, LOADER_WORKER, DATALOADER, "data_wait", inner,
                     "(in the dataset's __getitem__)", w.node, w.thread)
    return rewrite


# ---------------------------------------------------------------------------- the verdict
@dataclass
class Verdict:
    """One node's answer: is the job stuck, where, and who."""

    stuck: bool
    place: str
    phase: str = ""
    who: list[Where] = field(default_factory=list)
    others: list[Where] = field(default_factory=list)
    collective: bool = False  # some process waits in a collective
    #: stuck as far as this node can tell, but the missing work may run on another node (a
    #: worker-group call while every local worker idles): a hang only after the longer limit
    suspect: bool = False

    @property
    def long_phase(self) -> bool:
        """True when the job is in a long but healthy phase (validation, checkpoint, ...)."""
        return not self.stuck and self.place in LONG_PHASES

    def summary(self) -> str:
        """One sentence for a flag's evidence (who and where, and whether NCCL is the cause)."""
        if not self.who:
            return "no process of the job could be read"
        head = "; ".join(w.describe() for w in self.who[:3])
        if self.place == GONE:
            head += _gone_tail(self.who, self.others, self.collective)
        quiet = (RAY_IDLE, LOADER_IDLE)
        rest = [w for w in self.others if w.place not in quiet and w.role != "launcher"][:3]
        idle = [w for w in self.others if w.place == RAY_IDLE]
        waiting = [w for w in self.others if w.place == LOADER_IDLE]
        if rest:
            head += ". Also: " + "; ".join(w.describe() for w in rest)
        if idle:
            head += f". {len(idle)} worker(s) idle in Ray's task loop"
        if waiting:
            head += f". {len(waiting)} data loader worker(s) wait for their next index"
        if not self.collective and self.place != GONE:
            head += ". No rank waits in a collective: NCCL is not the cause"
        return head + "."

    def to_dict(self) -> dict:
        """Plain data for the ``hang_dump`` event."""
        return {"stuck": self.stuck, "place": self.place, "phase": self.phase,
                "long_phase": self.long_phase, "collective": self.collective,
                "suspect": self.suspect,
                "who": [w.to_dict() for w in self.who],
                "others": [w.to_dict() for w in self.others]}


def describe_where(role: str, pid: object, node: str, place: str, phase: str = "",
                   frame: str = "", detail: str = "", gpu: int | None = None,
                   rank: int | None = None) -> str:
    """One clause from a process's place: who (rank or role, PID, GPU, node), what it does,
    and its frame (``name (file:line)``). :meth:`Where.describe`, and the dashboard's reading
    of ``verlmon_hang_where_info``, whose labels carry the same fields."""
    who = f"rank {rank}" if rank is not None else f"the {role}" if role else "a process"
    ids = ", ".join(x for x in (f"PID {pid}" if pid else "",
                                f"GPU {gpu}" if gpu is not None else "",
                                f"node {node}" if node else "") if x)
    text = f"{who} ({ids})" if ids else who
    text += f" {PLACE_WORDS.get(place, place)}"
    if detail:
        text += detail if detail.startswith(":") else f" {detail}"
    if phase:
        text += f" [phase {phase}]"
    if frame:
        text += f", at {frame}"
    return text


def _gone_tail(who: list[Where], others: list[Where], collective: bool) -> str:
    """What the job's other processes do while the ``who`` are gone."""
    it = "it" if len(who) == 1 else "them"
    if collective:
        return f"; the others wait in a collective for {it}"
    if any(w.place == KERNEL for w in others):  # NCCL: synchronize behind the collective
        return f"; the others wait on their GPUs (under NCCL: in the collective) for {it}"
    if not any(w.place != GONE for w in others):
        return "; no other process of the job is left on this node"
    return ""


_DRIVERS = ("driver", "trainer", "rollouter")
#: Long phases that go on without the job's other processes (a gone one does not hold them).
_OWN_PHASES = frozenset((CHECKPOINT, VALIDATION, GENERATION))


def judge(wheres: Iterable[Where], gone: Iterable[Where] = ()) -> Verdict:
    """Compare one node's processes: the driver's place first, then the workers'.

    ``gone``: processes of the job seen alive in the silence that are gone now (killed or
    crashed; ``gone_where``). They are the likely cause while the others wait in a collective
    or are not stuck elsewhere: a rank that died leaves its peers waiting for it (under NCCL,
    often in a kernel: ``synchronize`` behind the collective). A driver stuck elsewhere (a
    reward, a loader) or in a healthy long phase of its own (a checkpoint, a validation, a
    generation) keeps its verdict. With no process of the job left, the verdict is only
    ``suspect`` (the job may have ended)."""
    ws = [w for w in wheres if w.place != UNKNOWN or w.frame is not None]
    dead = list(gone)
    if dead:
        base = _judge(ws)
        if (base.stuck or base.place in _OWN_PHASES) and not base.collective:
            base.others = base.others + dead
            return base
        return Verdict(bool(ws), GONE, base.phase, dead, ws, base.collective,
                       suspect=not ws)
    return _judge(ws)


def _judge(ws: list[Where]) -> Verdict:
    """``judge`` for the live processes only."""
    if not ws:
        return Verdict(False, UNKNOWN)
    coll = [w for w in ws if w.place == COLLECTIVE]
    drivers = [w for w in ws if w.role in _DRIVERS]
    workers = [w for w in ws if w.role not in _DRIVERS]
    collective = bool(coll)
    if coll and len(coll) < len(workers):  # some wait in a collective, some do not
        late = [w for w in workers if w.place != COLLECTIVE]
        return Verdict(True, COLLECTIVE, coll[0].phase, late, coll + drivers, True)
    for d in sorted(drivers, key=lambda w: -_RANK.get(w.place, 0)):
        if d.place in (REWARD, HTTP, REPLAY, DATALOADER, CHECKPOINT, VALIDATION):
            held = [w for w in workers if w.role == LOADER_WORKER and w.place == DATALOADER] \
                if d.place == DATALOADER else []  # the loader's workers hold the driver
            who = held + [d]
            return Verdict(d.stuck, d.place, d.phase, who, [w for w in ws if w not in who],
                           collective)
        if d.place == WORKER_CALL:
            return _worker_call(d, workers, ws, collective)
    busy = [w for w in workers if w.place in (METHOD, KERNEL, GENERATION, COLLECTIVE)]
    if busy:
        top = max(busy, key=lambda w: _RANK.get(w.place, 0))
        return Verdict(top.stuck, top.place, top.phase, busy, drivers, collective)
    top = max(ws, key=lambda w: _RANK.get(w.place, 0))
    return Verdict(top.stuck, top.place, top.phase, [top], [w for w in ws if w is not top],
                   collective)


def _worker_call(d: Where, workers: list[Where], ws: list[Where], collective: bool) -> Verdict:
    """The driver waits on a worker-group call: what its workers do says why."""
    workers = [w for w in workers if w.role not in ("launcher", LOADER_WORKER)]
    running = [w for w in workers if w.place != RAY_IDLE]
    method = next((w.detail.strip("()") for w in running if w.detail), "")
    phase = d.phase or _method_phase(method) or next((w.phase for w in running if w.phase), "")
    call = Where(d.pid, d.role, WORKER_CALL, phase, d.frame,
                 f"({method})" if method else "", d.node, d.thread)
    if not running and workers and phase != "testing":  # its workers may run elsewhere
        return Verdict(False, WORKER_CALL, phase, [call], workers, collective, suspect=True)
    if any(w.place == METHOD for w in running):
        stuck = [w for w in running if w.place == METHOD]
        return Verdict(True, METHOD, phase, stuck, [call] + [w for w in ws if w not in stuck
                                                               and w is not d], collective)
    if phase == "testing":  # a validation's generation or scoring: long, not stuck
        return Verdict(False, VALIDATION, phase, [call], running, collective)
    if running:
        top = max(running, key=lambda w: _RANK.get(w.place, 0))
        return Verdict(False, top.place if top.place in LONG_PHASES else GENERATION, phase,
                       [call], running, collective)
    return Verdict(False, WORKER_CALL, phase, [call], [], collective)
