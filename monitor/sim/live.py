"""Play a simulated run into a log file in real time (the demo and the exporter's sim backend).

``LiveSim(run, "train.log", speed=10).start()`` re-bases the run so it starts now, writes the
preamble at once, then appends each line when the wall clock passes its simulated time (scaled
by ``speed``). ``now_sim()`` gives the simulated instant matching the wall clock, to pass to
``run.gpu_sample_at``. Beside the log it keeps ``<log>.arrivals``, when each line was written
on that clock (as ``verl-monitor run`` records a captured job's lines), and at the end the exit
marker ``<log>.exit``. An exporter playing a run at another speed than 1 measures it on the
simulated clock (``LiveMonitor.use_clock``), so a step of 12 simulated seconds is 12 seconds
to the detectors at any speed.

With ``nccl_dir`` (or ``VERLMON_SIM_NCCL_DIR`` in the environment, which ``verl-monitor demo``
sets) the simulated job also dumps NCCL Inspector records there, as NCCL >= 2.28 does with
``NCCL_INSPECTOR_DUMP_DIR``: gradient AllReduces while ``update_actor`` runs and weight
AllGathers during ``reshard``, one record per rank, so the Communication page has data. They
are written beside the log lines; the simulator's own telemetry is unchanged.

A run in the ``agent_loop``, ``fully_async`` or ``separate_async`` mode also has rollout engines: ``start()``
serves one simulated vLLM (or SGLang) ``/metrics`` endpoint per engine server on 127.0.0.1
(``monitor/sim/engine_server.py``) and keeps each one's state on the simulated clock
(``monitor/sim/rollout_engines.py``); ``engine_urls`` lists them for the exporter's rollout collector.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from pathlib import Path

from monitor.hang.finish import clear_exit, mark_exit
from monitor.logs.arrivals import ArrivalWriter
from monitor.sim.engine import SimRun

#: Environment variable naming the folder for simulated NCCL Inspector dumps.
NCCL_DIR_ENV = "VERLMON_SIM_NCCL_DIR"
#: Simulated collectives per phase: (phase, collective, communicator, simulated seconds between
#: operations, share of that interval spent in the collective, message bytes).
NCCL_PLAN: tuple[tuple[str, str, str, float, float, int], ...] = (
    ("update_actor", "AllReduce", "actor_dp", 1.0, 0.18, 4 << 30),
    ("reshard", "AllGather", "rollout_tp", 0.5, 0.5, 2 << 30),
)


def nccl_records(run: SimRun, node: str, pid: int) -> list[tuple[float, dict]]:
    """(simulated time, Inspector record) for every simulated collective of the run, per rank
    (one rank per simulated GPU), in time order. ``dump_timestamp_us`` is filled in when the
    record is written."""
    ranks = int(getattr(run, "gpus_per_node", 8) or 8)
    out: list[tuple[float, dict]] = []
    seq = 0
    for st in run.steps:
        for phase, coll, comm, every, share, size in NCCL_PLAN:
            span = st.phases.get(phase)
            if not span:
                continue
            t = span[0] + every
            while t <= span[1] + 1e-9:
                seq += 1
                exec_s = every * share
                for rank in range(ranks):
                    busbw = size * 2 * (ranks - 1) / ranks / exec_s / 1e9
                    out.append((t, {
                        "header": {"id": f"0x{zlib.crc32(comm.encode()):x}", "comm_name": comm,
                                   "rank": rank, "n_ranks": ranks, "nnodes": 1},
                        "metadata": {"inspector_output_format_version": "v4.0",
                                     "dump_timestamp_us": 0, "hostname": node, "pid": pid},
                        "coll_perf": {"coll": coll, "coll_sn": seq, "coll_msg_size_bytes": size,
                                      "coll_exec_time_us": exec_s * 1e6,
                                      "coll_timing_source": "kernel_gpu",
                                      "coll_algobw_gbs": size / exec_s / 1e9,
                                      "coll_busbw_gbs": busbw},
                    }))
                t += every
    out.sort(key=lambda item: item[0])
    return out


def engine_fields(state: dict) -> dict:
    """``EngineServer.update`` fields from one ``RolloutSim.states_at`` row (no rates: the
    simulated clock moves the counters)."""
    return {
        "kv_cache_usage": state["kv_cache_usage"], "running": state["running"],
        "waiting": state["waiting"], "paused": state["paused"],
        "preemptions": state["preemptions_total"],
        "generation_tokens": state["generation_tokens_total"],
        "prompt_tokens": state["generation_tokens_total"] * 0.25,
        "requests_finished": state["e2e_latency_count"],
        "queue_time_sum": state["queue_time_sum_s"],
        "e2e_latency_sum": state["e2e_latency_sum_s"],
        "sleep_level": 1 if state["sleeping"] else 0,
        "tokens_per_s": 0.0, "requests_per_s": 0.0, "preemptions_per_s": 0.0,
    }


class LiveSim:
    """Appends a :class:`SimRun`'s lines to ``log_path`` as (scaled) wall-clock time passes."""

    def __init__(self, run: SimRun, log_path: str | os.PathLike[str], speed: float = 1.0,
                 nccl_dir: str | os.PathLike[str] | None = None,
                 engines: bool | None = None, engine: str = "vllm") -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.run = run
        self.log_path = Path(log_path)
        self.speed = float(speed)
        nccl_dir = nccl_dir if nccl_dir is not None else os.environ.get(NCCL_DIR_ENV) or None
        self.nccl_dir = Path(nccl_dir) if nccl_dir else None
        self.nccl_written = 0
        self._wall0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines_written = 0
        self.error: Exception | None = None
        #: serve the rollout engines (None: when the run's mode has them)
        self.with_engines = (getattr(run, "mode", "sync") != "sync") if engines is None \
            else bool(engines)
        self.engine = engine
        self.engine_servers: list = []
        self._rollout = None

    def start(self) -> None:
        """Re-base the run to start now and start the writer thread (a daemon)."""
        if self._thread is not None:
            raise RuntimeError("LiveSim already started")
        now = time.time()
        self._wall0 = now
        self.run.rebase(now)
        if self.with_engines:
            self._start_engines()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        clear_exit(self.log_path)
        self._thread = threading.Thread(target=self._loop, name="verl-monitor-livesim", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop writing and wait (bounded) for the thread to end; stop the engine servers."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._engine_thread is not None:
            self._engine_thread.join(timeout)
        for server in self.engine_servers:
            server.stop()

    # ------------------------------------------------------------------ rollout engines
    _engine_thread: threading.Thread | None = None

    @property
    def engine_urls(self) -> list[str]:
        """Base URLs (``http://127.0.0.1:PORT``) of the simulated engine servers."""
        return [server.url for server in self.engine_servers]

    def _start_engines(self) -> None:
        from monitor.sim.engine_server import EngineServer
        from monitor.sim.rollout_engines import RolloutSim

        self._rollout = RolloutSim(self.run, engine=self.engine)
        self.engine_servers = [
            EngineServer(self.engine, self._rollout.model).start()
            for _ in range(self._rollout.servers)
        ]
        self._update_engines()
        self._engine_thread = threading.Thread(target=self._engine_loop, daemon=True,
                                               name="verl-monitor-sim-engines")
        self._engine_thread.start()

    def _update_engines(self) -> None:
        """Set every engine server's state to the simulated instant matching now."""
        if self._rollout is None:
            return
        for server, st in zip(self.engine_servers, self._rollout.states_at(self.now_sim()),
                              strict=False):
            server.update(**engine_fields(st))

    def _engine_loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self._update_engines()
            except Exception as exc:  # reported through .error; the loop goes on
                self.error = exc

    @property
    def running(self) -> bool:
        """True while lines remain to be written and ``stop()`` was not called."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """True once every line of the run has been written."""
        return self._thread is not None and not self._thread.is_alive() and not self._stop.is_set()

    def now_sim(self) -> float:
        """The simulated time matching the wall clock now (``run.start_time`` at ``start()``)."""
        if self._wall0 is None:
            return self.run.start_time
        return self.run.start_time + (time.time() - self._wall0) * self.speed

    def sim_time_of(self, t_wall: float) -> float:
        """The simulated time matching wall-clock time ``t_wall`` (``now_sim`` at that time)."""
        if self._wall0 is None:
            return self.run.start_time
        return self.run.start_time + (t_wall - self._wall0) * self.speed

    def wall_time_of(self, t_sim: float) -> float:
        """The wall-clock time at which simulated time ``t_sim`` is reached."""
        wall0 = self._wall0 if self._wall0 is not None else time.time()
        return wall0 + (t_sim - self.run.start_time) / self.speed

    def _loop(self) -> None:
        try:
            items: list[tuple[float, int, object]] = [(t, 0, text)
                                                      for t, text in self.run.timed_lines()]
            dump = None
            if self.nccl_dir is not None:
                node = str((getattr(self.run, "node_names", None) or ["sim"])[0])
                self.nccl_dir.mkdir(parents=True, exist_ok=True)
                dump = (self.nccl_dir / f"{node}-pid{os.getpid()}.log").open(
                    "a", encoding="utf-8")
                items += [(t, 1, rec) for t, rec in nccl_records(self.run, node, os.getpid())]
                items.sort(key=lambda item: (item[0], item[1]))
            arrivals = ArrivalWriter(self.log_path)
            try:
                with self.log_path.open("ab") as fh:
                    for t_sim, kind, item in items:
                        while not self._stop.is_set():
                            wait = self.wall_time_of(t_sim) - time.time()
                            if wait <= 0:
                                break
                            self._stop.wait(min(wait, 0.5))
                        if self._stop.is_set():
                            return
                        if kind == 0:
                            # when the line was printed, on the run's own clock, as
                            # `verl-monitor run` records it for a job it captures
                            data = (str(item) + "\n").encode("utf-8")
                            offset = fh.tell()
                            arrivals.record(offset, t_sim, offset + len(data))
                            fh.write(data)
                            fh.flush()
                            if self.speed != 1.0:  # written on the run's clock, as captured
                                os.utime(self.log_path, (t_sim, t_sim))
                            self.lines_written += 1
                        elif dump is not None:
                            self._dump(dump, item, t_sim)
                if getattr(self.run, "outcome", "completed") == "completed":
                    # the simulated job ended: its run finished (on the run's own clock)
                    mark_exit(self.log_path, 0, when=self.now_sim())
            finally:
                arrivals.close()
                if dump is not None:
                    dump.close()
        except Exception as exc:  # reported through .error; the thread must end
            self.error = exc

    def _dump(self, fh, record, t_sim: float) -> None:
        """Write one Inspector record stamped with the simulated time it is written at (the
        clock the exporter measures a sped-up run on; the wall clock at 1x)."""
        rec = json.loads(json.dumps(record))
        rec["metadata"]["dump_timestamp_us"] = int(t_sim * 1e6)
        fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        fh.flush()
        self.nccl_written += 1
