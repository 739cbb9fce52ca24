"""The job's processes on this node, proven so, and which is which rank on which GPU (/proc).

:func:`job_process_tree` is the one answer to "which processes are the job's": a process counts
only when it is proven the job's (a descendant of the job ``verl-monitor run`` started, or of
``--hang-job-pid``, or a Ray actor under the job's own raylet, always with the job's user); a
PID printed in the log, a process title or a GPU holder is a hint that must pass that proof.
The monitor itself is known by its PID, never by a module name.

A rank holds its debug-info FIFO (``pipe_<rank>.pipe``) open for reading, and a CUDA process
holds ``/dev/nvidia<N>`` open for each GPU it uses, so a pass over the job's ``/proc/<pid>/fd``
maps ranks to PIDs and PIDs to GPUs (N is the device's minor number, which is NVML's index on
ordinary hosts). Processes we may not read are skipped; Linux only (elsewhere: empty maps).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from monitor.logs import safe_read

_NVIDIA = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass
class ProcessMap:
    """PIDs by FIFO path, and GPUs by PID."""

    fifo_pids: dict[str, int] = field(default_factory=dict)
    gpu_pids: dict[int, set[int]] = field(default_factory=dict)  # pid -> GPU minors

    def gpu_of(self, pid: int | None) -> int | None:
        """The lowest GPU the process has open (None when unknown)."""
        gpus = self.gpu_pids.get(pid or -1)
        return min(gpus) if gpus else None


def scan(fifos: list[Path] | None = None, proc: str = "/proc",
         pids: Iterable[int] | None = None) -> ProcessMap:
    """Who reads each FIFO of ``fifos``, and which GPUs each process uses: of ``pids`` (the
    job's proven processes), or of every process in ``proc`` when None."""
    wanted = {os.path.realpath(p) for p in (fifos or [])}
    out = ProcessMap()
    me = os.getpid()
    if pids is None:
        try:
            pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
        except OSError:
            return out
    for pid in pids:
        if pid == me:
            continue
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            m = _NVIDIA.match(target)
            if m:
                out.gpu_pids.setdefault(pid, set()).add(int(m.group(1)))
            elif target in wanted:
                out.fifo_pids.setdefault(target, pid)
    return out


# ---------------------------------------------------------------------------- /proc, read lightly
PROC = "/proc"
#: Most processes walked in one job tree (a verl node runs a few dozen).
MAX_TREE = 4096


@dataclass(frozen=True)
class ProcInfo:
    """What the proof needs of one process: parent, real and effective user, name, start
    time (clock ticks after boot: a PID reused later has another) and command line."""

    pid: int
    ppid: int
    uid: int | None
    euid: int | None
    comm: str
    start: int
    cmdline: str

    @property
    def argv0(self) -> str:
        """The program's base name as its command line gives it."""
        return os.path.basename(self.cmdline.split(" ", 1)[0]) if self.cmdline else ""


def _read(path: str, limit: int = 1 << 16) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _stat(pid: int, proc: str = PROC) -> tuple[int, str, int] | None:
    """(parent PID, name, start time) from ``/proc/<pid>/stat``."""
    raw = _read(f"{proc}/{pid}/stat", 4096)
    if not raw:
        return None
    text = raw.decode("utf-8", "replace")
    lpar, rpar = text.find("("), text.rfind(")")
    rest = text[rpar + 2:].split()
    try:
        return int(rest[1]), text[lpar + 1:rpar], int(rest[19])
    except (IndexError, ValueError):
        return None


def proc_info(pid: int, proc: str = PROC) -> ProcInfo | None:
    """The process's :class:`ProcInfo` (None when it is gone or cannot be read)."""
    st = _stat(pid, proc)
    status = _read(f"{proc}/{pid}/status")
    if st is None or status is None:
        return None
    uid = euid = None
    for line in status.decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            if len(parts) >= 3 and parts[1].isdigit() and parts[2].isdigit():
                uid, euid = int(parts[1]), int(parts[2])
            break
    cmd = _read(f"{proc}/{pid}/cmdline") or b""
    return ProcInfo(pid, st[0], uid, euid, st[1], st[2],
                    cmd.replace(b"\0", b" ").decode("utf-8", "replace").strip())


class ProcTable:
    """Parents and children of this host's processes, read once per look (``/proc``)."""

    def __init__(self, proc: str = PROC) -> None:
        self.proc = proc
        self._info: dict[int, ProcInfo | None] = {}
        self._kids: dict[int, list[int]] | None = None

    def info(self, pid: int) -> ProcInfo | None:
        """The process's :class:`ProcInfo`, read once."""
        if pid not in self._info:
            self._info[pid] = proc_info(pid, self.proc)
        return self._info[pid]

    def _children_map(self) -> dict[int, list[int]]:
        if self._kids is None:
            kids: dict[int, list[int]] = {}
            try:
                pids = [int(d) for d in os.listdir(self.proc) if d.isdigit()]
            except OSError:
                pids = []
            for pid in pids:
                st = _stat(pid, self.proc)
                if st is not None:
                    kids.setdefault(st[0], []).append(pid)
            self._kids = kids
        return self._kids

    def children(self, pid: int) -> list[int]:
        """The process's children (its threads' ``children`` files where the kernel has them,
        else one pass over every process's parent)."""
        try:
            tids = os.listdir(f"{self.proc}/{pid}/task")
        except OSError:
            return []
        out: list[int] = []
        for tid in tids:
            raw = _read(f"{self.proc}/{pid}/task/{tid}/children")
            if raw is None:
                return sorted(self._children_map().get(pid, []))
            out.extend(int(x) for x in raw.split() if x.isdigit())
        return sorted(set(out))

    def descendants(self, root: int, limit: int = MAX_TREE) -> list[int]:
        """Every descendant of ``root``, parents before children (at most ``limit``)."""
        out: list[int] = []
        todo = [root]
        seen = {root}
        while todo and len(out) < limit:
            for child in self.children(todo.pop(0)):
                if child not in seen:
                    seen.add(child)
                    out.append(child)
                    todo.append(child)
        return out[:limit]

    def ancestors(self, pid: int, limit: int = 64) -> list[ProcInfo]:
        """The process's parent, grandparent, ... up to PID 1 (each that can be read)."""
        out: list[ProcInfo] = []
        cur = self.info(pid)
        while cur is not None and cur.ppid > 0 and len(out) < limit:
            cur = self.info(cur.ppid)
            if cur is not None:
                out.append(cur)
        return out


# ---------------------------------------------------------------------------- the job's processes
#: Ray's log prefix: ``(TaskRunner pid=123)``, ``(WorkerDict pid=45, ip=10.0.0.2)``.
RAY_PREFIX = re.compile(r"\((?P<cls>[A-Za-z_]\w*) pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9a-fA-F.:]+))?"
                        r"\)")
#: How much of the end of each followed log is read for Ray's prefixes.
LOG_TAIL_BYTES = 1 << 20
#: Processes stacked at most per round.
MAX_PROCESSES = 32
#: The variable ``verl-monitor run`` sets, to its own PID, in its exporter's environment: the
#: exporter's parent is then proven to be the run, and the run's job is this node's job.
RUN_PID_ENV = "VERLMON_RUN_PID"
#: The monitor's own command lines, for dumps saved by older exporters (read offline): the
#: live exporter knows itself by its PID.
_MONITOR = re.compile(r"(?:^|[\s/])verl-monitor(?:\s|$)|(?:^|\s)-m\s+monitor(?:\.cli)?(?:\s|$)")
#: Ray's own daemons (dashboard, agents, log monitor, autoscaler, client server): not the job's.
_RAY_DAEMON = re.compile(r"(?:^|[\s/])ray/(?:dashboard|_private|autoscaler|util/client)/"
                         r"|(?:^|\s)-m\s+ray\.")


def is_monitor(cmdline: str) -> bool:
    """True when a saved dump's command line is the monitor itself (``verl-monitor ...``,
    ``python -m monitor ...``); a job's ``python -m pkg.cli.main`` is not."""
    return bool(_MONITOR.search(cmdline))


@dataclass(frozen=True)
class JobProcess:
    """One local process of the job: its PID, role (driver, worker, ...) and how it was
    proven (``tree``: a descendant of ``verl-monitor run``'s job or of ``--hang-job-pid``;
    ``ray``: under the job's own raylet; ``log``: named in the log and proven; ``child``: a
    fork or a Python child of one of those), its title and start time (a reused PID has
    another)."""

    pid: int
    role: str
    source: str
    title: str = ""
    start: int | None = None


@dataclass(frozen=True)
class JobTree:
    """The job's proven processes on this node, how they were proven (``proof``) and, when
    none is, why (``why``, in words)."""

    procs: tuple[JobProcess, ...] = ()
    proof: str = ""
    why: str = ""

    @property
    def pids(self) -> frozenset[int]:
        """The PIDs of the job's proven processes."""
        return frozenset(p.pid for p in self.procs)


def log_pids(text: str) -> dict[int, tuple[str, str]]:
    """PID -> (actor class, ip or '') of every Ray prefix in ``text`` (the last one wins)."""
    return {int(m.group("pid")): (m.group("cls"), m.group("ip") or "")
            for m in RAY_PREFIX.finditer(text)}


def read_tail(path: str | Path, size: int = LOG_TAIL_BYTES) -> str:
    """The last ``size`` bytes of a file as text ('' when unreadable): a regular file only,
    opened without blocking (``monitor.logs.safe_read``: a FIFO or a link to a device gives
    '', as the log's follower says and counts)."""
    try:
        return safe_read.read_tail(path, size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def local_addresses() -> set[str]:
    """This host's IP addresses (loopback included)."""
    import psutil

    out = {"127.0.0.1", "::1"}
    try:
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%")[0] for a in addrs if a.address)
    except OSError:
        pass
    return out


def run_parent(environ: dict[str, str] | None = None, ppid: int | None = None) -> int | None:
    """The exporter's parent when it is ``verl-monitor run`` (it set ``RUN_PID_ENV`` to its own
    PID in our environment and is still our parent), else None."""
    env = os.environ if environ is None else environ
    parent = os.getppid() if ppid is None else ppid
    value = str(env.get(RUN_PID_ENV, ""))
    return parent if value.isdigit() and int(value) == parent and parent > 1 else None


def _is_raylet(p: ProcInfo) -> bool:
    return p.comm == "raylet" or p.argv0 == "raylet"


def _same_user(p: ProcInfo | None, uid: int | None) -> bool:
    return p is not None and uid is not None and p.uid == uid and p.euid == uid


def _is_python(title: str) -> bool:
    """A Ray worker or a Python process (py-spy reads Python only)."""
    return title.startswith("ray::") or os.path.basename(title.split(" ", 1)[0]).startswith(
        "python")


@dataclass
class _Proof:
    """The processes proven so far (pid -> JobProcess), the words, and what failed."""

    table: ProcTable
    mine: set[int]
    found: dict[int, JobProcess] = field(default_factory=dict)
    proofs: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def member(self, pid: int, uid: int | None, source: str, role: str = "",
               under_ray: bool = False) -> None:
        """Count ``pid`` when it runs as ``uid`` and is a Python process of the job (a Ray
        actor under a raylet; any Python process but Ray's daemons in a run's tree)."""
        if pid in self.found or pid in self.mine:
            return
        p = self.table.info(pid)
        if not _same_user(p, uid):
            return
        title = p.cmdline
        parent = self.found.get(p.ppid)
        if parent is not None and (title == parent.title or (
                parent.title.startswith("ray::") and not title.startswith("ray::"))):
            if _is_python(title) or title == parent.title:  # a fork, a pool, a loader worker
                self.found[pid] = JobProcess(pid, "child", "child", title, p.start)
            return
        if title.startswith("ray::"):
            from monitor.hang.where import role_of

            r, _ = role_of(title, role or "worker")
            if r != "idle":
                self.found[pid] = JobProcess(pid, role or r, source, title, p.start)
            return
        if under_ray or not _is_python(title) or _RAY_DAEMON.search(title):
            return
        self.found[pid] = JobProcess(pid, role or "child", source, title, p.start)


def job_process_tree(logs: Iterable[str] = (), run_pid: int | None = None,
                     job_pid: int | None = None, limit: int = MAX_PROCESSES,
                     proc: str = PROC, me: int | None = None) -> JobTree:
    """The job's processes on this node, each *proven* the job's: a descendant of the job that
    ``verl-monitor run`` (``run_pid``, see :func:`run_parent`) started, or of ``job_pid``
    (``--hang-job-pid``), running as that job's user; or a Ray actor under the job's own raylet,
    found from a PID the followed log prints (``(TaskRunner pid=N)`` on this host) that runs as
    the log's owner under a raylet of that same user, or, with none of those, the raylet this
    exporter itself runs under (started inside the job's Ray cluster, ``deploy/ray``). A PID in
    the log, a process title or a GPU holder alone proves nothing; the monitor (``me``, the
    run, the actor that started it) is never one.
    Drivers first, at most ``limit``; with none, ``why`` says what was missing."""
    table = ProcTable(proc)
    me = os.getpid() if me is None else me
    # the monitor: this process and the run (the py-spy processes it starts are no Python)
    pf = _Proof(table, {me} | ({run_pid} if run_pid else set()))
    if run_pid:
        _from_root(pf, run_pid, "the job `verl-monitor run` started", skip_root=True)
    if job_pid:
        _from_root(pf, job_pid, f"--hang-job-pid {job_pid}", skip_root=False)
    _from_logs(pf, [str(p) for p in logs])
    if not pf.found:
        _from_own_raylet(pf, me)
    if any(p.source == "log" and p.role in ("driver", "trainer") for p in pf.found.values()):
        for pid, p in list(pf.found.items()):  # the launcher under run: the log names the driver
            if p.role == "driver" and p.source == "tree" and not p.title.startswith("ray::"):
                pf.found[pid] = JobProcess(pid, "launcher", p.source, p.title, p.start)
    order = {"driver": 0, "trainer": 1, "rollouter": 1}
    procs = sorted(pf.found.values(), key=lambda p: (order.get(p.role, 2), p.pid))[:limit]
    if procs:
        return JobTree(tuple(procs), "; ".join(pf.proofs))
    return JobTree((), "; ".join(pf.proofs), _why(pf, bool(run_pid or job_pid), bool(logs)))


def _from_root(pf: _Proof, root: int, what: str, skip_root: bool) -> None:
    """The descendants (and ``root`` itself unless ``skip_root``) running as ``root``'s user;
    the first Python one is the driver unless a Ray title says otherwise."""
    info = pf.table.info(root)
    if info is None:
        pf.refused.append(f"{what}: PID {root} cannot be read")
        return
    pids = ([] if skip_root else [root]) + [p for p in pf.table.descendants(root)
                                            if p not in pf.mine]
    before = len(pf.found)
    for pid in pids:
        has_driver = any(p.role in ("driver", "trainer") for p in pf.found.values())
        pf.member(pid, info.uid, "tree", "" if has_driver else "driver")
    pf.proofs.append(f"{len(pf.found) - before} process(es) under {what} (uid {info.uid})")


def _from_logs(pf: _Proof, logs: list[str]) -> None:
    """Ray actors the logs name on this host, proven under a raylet of the log's owner; then
    that raylet's other actors (the job's quiet workers)."""
    from monitor.hang.where import ROLES

    here: set[str] | None = None
    for path in logs:
        try:
            owner = os.stat(path).st_uid
        except OSError:
            continue
        named = log_pids(read_tail(path))
        if any(ip for _, ip in named.values()):
            here = here if here is not None else local_addresses()
        raylets: dict[int, ProcInfo] = {}
        for pid, (cls, ip) in sorted(named.items()):
            if ip and ip not in (here or ()):
                continue  # another node's
            if pid in pf.found:
                if pf.found[pid].source != "child":  # proven by the tree: the log names it
                    pf.found[pid] = JobProcess(pid, ROLES.get(cls, cls), "log",
                                               pf.found[pid].title, pf.found[pid].start)
                continue
            raylet = _proven_raylet(pf, pid, owner)
            if raylet is not None:
                raylets[raylet.pid] = raylet
                pf.member(pid, owner, "log", ROLES.get(cls, cls), under_ray=True)
        for raylet in raylets.values():
            before = len(pf.found)
            for pid in pf.table.descendants(raylet.pid):
                pf.member(pid, owner, "ray", under_ray=True)
            pf.proofs.append(f"{len(pf.found) - before} more under the job's raylet "
                             f"(PID {raylet.pid}, uid {owner}), named by {path}")


def _from_own_raylet(pf: _Proof, me: int) -> None:
    """An exporter started inside the job's Ray cluster (``deploy/ray``: under a Ray actor of
    that cluster's raylet on this node): that raylet's actors, as its user, are the job's."""
    ups = pf.table.ancestors(me)
    raylet = next((p for p in ups if _is_raylet(p)), None)
    if raylet is None:
        return
    pf.mine.update(p.pid for p in ups)  # the actor that started this exporter is not the job's
    before = len(pf.found)
    for pid in pf.table.descendants(raylet.pid):
        pf.member(pid, raylet.uid, "ray", under_ray=True)
    pf.proofs.append(f"{len(pf.found) - before} process(es) under the raylet this exporter "
                     f"runs under (PID {raylet.pid}, uid {raylet.uid})")


def _proven_raylet(pf: _Proof, pid: int, owner: int) -> ProcInfo | None:
    """The raylet above ``pid`` when ``pid`` and it run as ``owner`` (the log's owner); else
    None, with the reason kept for :func:`_why`."""
    p = pf.table.info(pid)
    if p is None:
        return None  # gone, or not ours to read: nothing to say
    if not _same_user(p, owner):
        pf.refused.append(f"PID {pid} runs as uid {p.uid}, not as the log's owner (uid {owner})")
        return None
    for up in pf.table.ancestors(pid):
        if _is_raylet(up):
            if _same_user(up, owner):
                return up
            pf.refused.append(f"PID {pid}'s raylet (PID {up.pid}) runs as uid {up.uid}")
            return None
    pf.refused.append(f"PID {pid} runs under no Ray raylet")
    return None


def _why(pf: _Proof, rooted: bool, logs: bool) -> str:
    """Why no process of the job is proven, in words."""
    head = "no process of the job is proven on this node, so no stacks are taken"
    if pf.refused:
        return f"{head}: {'; '.join(pf.refused[:4])}"
    if rooted:
        return f"{head}: {'; '.join(pf.proofs) or 'the job has no Python process yet'}"
    return (f"{head}: the exporter was not started by `verl-monitor run` nor inside the job's "
            "Ray cluster, no --hang-job-pid was given, and "
            + ("no followed log names a Ray process of this host" if logs
               else "no log is followed"))


# ---------------------------------------------------------------------------- processes gone
def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed and not yet reaped, is gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


@dataclass(frozen=True)
class GoneProcess:
    """A process of the job seen alive that is gone: when it was last seen alive, and the
    GPU and rank it had then (None when unknown)."""

    proc: JobProcess
    last_alive: float
    gone_at: float
    gpu: int | None = None
    rank: int | None = None


#: Sources of processes that live as long as the job: a data loader's or reward pool's
#: children come and go by themselves (``persistent_workers=False``), their end is no news.
LASTING_SOURCES = frozenset(("log", "tree", "ray"))


@dataclass
class GoneWatch:
    """The job's lasting processes, looked at every poll: the ones that went away.

    :meth:`see` takes each fresh list of the job's processes (with their GPU and rank where
    known), :meth:`check` the liveness of those seen; both are given the time, so the class
    is pure but for the ``is_alive`` function it is built with."""

    is_alive: Callable[[int], bool] = alive
    seen: dict[int, tuple[JobProcess, float, int | None, int | None]] = field(
        default_factory=dict)
    gone: dict[int, GoneProcess] = field(default_factory=dict)
    keep_s: float = 3600.0

    def see(self, procs: list[JobProcess], now: float, gpus: dict[int, int] | None = None,
            ranks: dict[int, int] | None = None) -> None:
        """Remember the lasting ones of ``procs`` as alive at ``now``."""
        gpus, ranks = gpus or {}, ranks or {}
        for p in procs:
            if p.source not in LASTING_SOURCES:
                continue
            old = self.seen.get(p.pid)
            gpu = gpus.get(p.pid, old[2] if old else None)
            rank = ranks.get(p.pid, old[3] if old else None)
            self.seen[p.pid] = (p, now, gpu, rank)
            self.gone.pop(p.pid, None)  # back (a reused PID): alive again

    def check(self, now: float) -> list[GoneProcess]:
        """The processes seen that are no longer alive at ``now`` (newly gone ones)."""
        new = []
        for pid, (p, last, gpu, rank) in list(self.seen.items()):
            if self.is_alive(pid):
                self.seen[pid] = (p, now, gpu, rank)
                continue
            del self.seen[pid]
            g = GoneProcess(p, last, now, gpu, rank)
            self.gone[pid] = g
            new.append(g)
        for pid in [k for k, g in self.gone.items() if now - g.gone_at > self.keep_s]:
            del self.gone[pid]
        return new

    def gone_since(self, t: float) -> list[GoneProcess]:
        """The processes gone after ``t`` (alive at ``t`` or later), by when they went."""
        return sorted((g for g in self.gone.values() if g.last_alive >= t),
                      key=lambda g: (g.last_alive, g.proc.pid))
