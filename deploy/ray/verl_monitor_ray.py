"""verl-monitor on a Ray cluster (verl's own runtime): one exporter on every Ray node.

Each exporter runs under a detached, node-pinned Ray actor (``num_cpus=0``, so it takes no
slot from verl's workers) that starts ``python -m monitor exporter`` on its node and stops it
when the actor is killed. The node this script runs on (the driver's, where verl's log is
written) gets ``--log``; the others sample GPUs and host and read the driver's phase timeline
from its /metrics (``--phase-source``), so every node's GPUs get per-phase counters.
Prometheus targets come from Ray's node list (``ray.nodes()``).

On the head node, once ``ray start`` ran on every node::

    python deploy/ray/verl_monitor_ray.py start --driver-log /tmp/verl/train.log \\
        --targets-file /shared/prometheus/targets/grpo.json --job grpo
    verl-monitor run --no-exporter --log /tmp/verl/train.log -- \\
        python3 -m verl.trainer.main_ppo trainer.nnodes=16 ...
    python deploy/ray/verl_monitor_ray.py stop --targets-file /shared/prometheus/targets/grpo.json

``start`` is idempotent: run it again after nodes join and only the new ones get an exporter.
Options after ``--`` go to every exporter (e.g. ``-- --nccl-dir /tmp/nccl``). Needs ``ray``
and ``verl-monitor`` installed in the Python environment of every Ray worker (verl's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: Ray namespace of the exporter actors (so ``stop`` finds them from any driver).
NAMESPACE = "verl-monitor"
ACTOR_PREFIX = "verlmon-exporter-"
DEFAULT_PORT = 9048
READY_S = 60.0
#: Seconds before an exporter that ended unasked is started again.
RESTART_S = 10.0
_SERVING = re.compile(r"serving (https?)://[^/]*:(\d+)/metrics")


class NodeExporter:
    """Ray actor body: one ``verl-monitor exporter`` child on this actor's node, started again
    (after ``RESTART_S``) when it ends unasked: a crash, SIGHUP (exit 129); not after a clean
    stop (0) or bad options (2). Ray's ``max_restarts`` covers the actor itself only."""

    def __init__(self, argv: list[str], out_path: str) -> None:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        self.argv = list(argv)
        self.out_path = out_path
        self.restarts = 0
        self._stopping = False
        self.port: int | None = None
        self._spawn()
        threading.Thread(target=self._watch, name="exporter-watch", daemon=True).start()

    def _spawn(self) -> None:
        """Start the exporter; return once it printed its startup line (RuntimeError if not)."""
        out_path = self.out_path
        self.port = None  # until this run says where it serves
        with open(out_path, "ab") as out:
            start = out.tell()  # only this run's output counts
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "monitor", "exporter", *self.argv], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_die_with_parent, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            with open(out_path, "rb") as fh:
                fh.seek(start)
                text = fh.read().decode(errors="replace")
            found = _SERVING.search(text)
            if found:
                self.port = int(found.group(2))
                return
            if self.proc.poll() is not None:
                lines = [ln for ln in text.splitlines() if ln.strip()]
                raise RuntimeError(f"exporter exited with status {self.proc.returncode}: "
                                   f"{lines[-1] if lines else 'no output'}")
            time.sleep(0.1)
        raise RuntimeError(f"exporter printed no startup line within {READY_S:.0f} s "
                           f"(see {out_path})")

    def _watch(self) -> None:
        while True:
            status = self.proc.wait()
            if self._stopping or status in (0, 2):
                return
            time.sleep(RESTART_S)
            if self._stopping:
                return
            self.restarts += 1
            try:
                self._spawn()
            except RuntimeError:
                continue  # said in its output file; its status decides the next round

    def port_of(self) -> int | None:
        """The port the exporter serves on (``None`` when it has exited)."""
        return self.port if self.proc.poll() is None else None

    def stop(self) -> int | None:
        """SIGTERM the exporter, SIGKILL after 15 s; its exit status (no restart after it)."""
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        return self.proc.returncode


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def node_names(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Ray node id -> the ``node`` label: the host name, plus a short node id where several
    Ray nodes share a host (several raylets on one machine)."""
    hosts = [n.get("NodeManagerHostname") or n["NodeManagerAddress"] for n in nodes]
    out = {}
    for n, host in zip(nodes, hosts, strict=True):
        short = host.split(".")[0]
        out[n["NodeID"]] = short if hosts.count(host) == 1 else f"{short}-{n['NodeID'][:6]}"
    return out


def targets_for(nodes: list[dict[str, Any]], ports: dict[str, int], names: dict[str, str],
                job: str | None) -> list[dict[str, Any]]:
    """Prometheus file_sd groups: the node's IP and its exporter's port, with ``node`` and
    ``ray_node_id`` labels (and ``job`` when given)."""
    groups = []
    for n in nodes:
        port = ports.get(n["NodeID"])
        if port is None:
            continue
        labels = {"node": names[n["NodeID"]], "ray_node_id": n["NodeID"][:12]}
        if job:
            labels["job"] = job
        groups.append({"targets": [f"{n['NodeManagerAddress']}:{port}"], "labels": labels})
    return groups


def _write_json(path: str, data: Any) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, p)


def start(args: argparse.Namespace) -> int:
    """Start (or find) an exporter actor on every alive Ray node; write the targets."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False,
             _node_ip_address=args.node_ip_address)
    driver_node = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    names = node_names(nodes)
    actor_cls = ray.remote(num_cpus=0, max_restarts=-1)(NodeExporter)
    ip = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
    # the driver's node first: the others read its phase timeline from its /metrics
    order = sorted(nodes, key=lambda n: n["NodeID"] != driver_node)
    handles = {}
    ports: dict[str, int] = {}
    source = None
    for n in order:
        nid = n["NodeID"]
        argv = ["--listen-address", f"0.0.0.0:{args.port}", "--node", names[nid]]
        if args.driver_log and nid == driver_node:
            argv += ["--log", args.driver_log]
        elif source:
            argv += ["--phase-source", source]
        argv += list(args.exporter_args)
        handles[nid] = actor_cls.options(
            name=ACTOR_PREFIX + nid[:12], lifetime="detached", get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
        ).remote(argv, f"{args.out_dir}/exporter-{names[nid]}.log")
        if nid == driver_node:
            port = _port(ray, handles[nid], names[nid])
            if port is not None:
                ports[nid] = port
                source = f"http://{ip[nid]}:{port}/metrics" if args.driver_log else None
    for nid, handle in handles.items():
        if nid not in ports:
            port = _port(ray, handle, names[nid])
            if port is not None:
                ports[nid] = port
    groups = targets_for(nodes, ports, names, args.job)
    for g in groups:
        print(f"verl_monitor_ray: exporter on {g['labels']['node']} at {g['targets'][0]}")
    if args.targets_file:
        _write_json(args.targets_file, groups)
        print(f"verl_monitor_ray: {len(groups)} target(s) written to {args.targets_file}")
    return 0 if len(ports) == len(nodes) else 1


def _port(ray: Any, handle: Any, name: str) -> int | None:
    """The port of an exporter actor, or None (said on stderr) when it did not start."""
    try:
        return ray.get(handle.port_of.remote(), timeout=READY_S + 30)
    except Exception as exc:  # noqa: BLE001 - one bad node must not hide the others
        print(f"verl_monitor_ray: node {name}: {exc}", file=sys.stderr)
        return None


def stop(args: argparse.Namespace) -> int:
    """Stop every exporter actor of the namespace; remove the targets file."""
    import ray

    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False,
             _node_ip_address=args.node_ip_address)
    stopped = 0
    for info in ray.util.list_named_actors(all_namespaces=False):
        name = info if isinstance(info, str) else info.get("name", "")
        if not name.startswith(ACTOR_PREFIX):
            continue
        handle = ray.get_actor(name)
        try:
            ray.get(handle.stop.remote(), timeout=30)
        except Exception as exc:  # noqa: BLE001 - killed below anyway
            print(f"verl_monitor_ray: {name}: {exc}", file=sys.stderr)
        ray.kill(handle, no_restart=True)
        stopped += 1
    if args.targets_file:
        Path(args.targets_file).unlink(missing_ok=True)
    print(f"verl_monitor_ray: stopped {stopped} exporter(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start`` or ``stop``; exporter options after ``--``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="verl_monitor_ray.py", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("start", "stop"))
    p.add_argument("--address", default="auto", help="Ray cluster address (default auto)")
    p.add_argument("--node-ip-address", metavar="IP",
                   help="this node's IP as Ray knows it, when Ray cannot guess it (as `ray start "
                   "--node-ip-address`)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"exporter port on every node (default {DEFAULT_PORT}; 0: any free)")
    p.add_argument("--driver-log", metavar="PATH",
                   help="verl's log on this (the driver's) node, as `verl-monitor run --log`")
    p.add_argument("--targets-file", metavar="PATH", help="Prometheus file_sd targets (JSON)")
    p.add_argument("--job", help="`job` label in the targets (default: the scrape job's name)")
    p.add_argument("--out-dir", default="/tmp/verl-monitor-ray",
                   help="where each node's exporter output goes (default /tmp/verl-monitor-ray)")
    args = p.parse_args(argv)
    args.exporter_args = extra
    return start(args) if args.action == "start" else stop(args)


if __name__ == "__main__":
    sys.exit(main())
