"""deploy/slurm/verl-monitor.sbatch on a real Slurm: slurmctld + slurmd on this machine (one
node), a job submitted with sbatch, its exporter scraped by a real Prometheus from the
file_sd targets the job writes, everything gone when the job ends.

Slurm comes from Debian's ``slurm-wlm``; when it is missing and we are root with apt-get, the
fixture installs it (CI is a fresh Debian machine), otherwise the test is skipped with the
reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dashboard_check import chromium_missing, nodes_shown_by_dashboard
from procs import RULES_DIR, free_port, start_prometheus, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SBATCH_SCRIPT = REPO / "deploy" / "slurm" / "verl-monitor.sbatch"
CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"


def _ensure_slurm() -> str | None:
    """None when slurmctld/slurmd/sbatch are there (installing them if we can); else why not."""
    tools = ("slurmctld", "slurmd", "sbatch", "scontrol")
    if all(shutil.which(t) for t in tools):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get") or os.environ.get("VERLMON_NO_INSTALL"):
        return "Slurm is not installed and this user cannot apt-get install slurm-wlm"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm"], env=env,
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"apt-get install slurm-wlm failed: {exc}"
    if done.returncode != 0 or not all(shutil.which(t) for t in tools):
        return f"apt-get install slurm-wlm failed: {done.stderr.strip()[-300:]}"
    return None


SLURM_CONF = """\
ClusterName=verlmon
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm cluster of our own (own ports, state and config); yields its env."""
    reason = _ensure_slurm()
    if reason:
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("slurm")
    (d / "state").mkdir()
    (d / "spool").mkdir()
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, ctld_port=free_port(), slurmd_port=free_port(),
                                      dir=d, cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids = []
    try:
        for daemon, log in (("slurmctld", "ctld.log"), ("slurmd", "slurmd.log")):
            subprocess.run([daemon, "-f", str(conf), "-L", str(d / log)], env=env, check=True,
                           timeout=30)
            if daemon == "slurmctld":
                wait_until(lambda: subprocess.run(["scontrol", "ping"], env=env,
                                                  capture_output=True, text=True,
                                                  timeout=10).stdout.count("UP"),
                           30, what="slurmctld to answer")
        wait_until(lambda: "idle" in subprocess.run(
            ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True,
            timeout=10).stdout, 60, what="the node to be idle")
        yield {"env": env, "dir": d, "host": host}
    finally:
        # end our jobs while slurmd still runs, so their steps (exporters) are cleaned up
        subprocess.run(["scancel", "--full", "--user", str(os.geteuid())], env=env,
                       capture_output=True, timeout=30)
        try:
            wait_until(lambda: not subprocess.run(
                ["squeue", "-h"], env=env, capture_output=True, text=True,
                timeout=10).stdout.strip(), 30, what="jobs to end")
        except TimeoutError:
            pass
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            path = d / pidfile
            if path.exists():
                pids.append(int(path.read_text().split()[0]))
        for pid in pids:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass


TRAINER = """\
import os, sys, time
for step in range(1, 400):
    time.sleep(2)
    print(f"(TaskRunner pid=1) step:{step} - timing_s/gen:1.2 - timing_s/update_actor:0.6 - "
          f"timing_s/step:2.0 - perf/throughput:1000.0 - training/global_step:{step}", flush=True)
    if os.path.exists(sys.argv[1]):
        sys.exit(0)
sys.exit(1)
"""


def _job_field(env: dict, job_id: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                         text=True, timeout=10).stdout
    for word in out.split():
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return ""


def test_sbatch_recipe_brings_up_an_exporter_per_node_scraped_via_file_sd(slurm, tmp_path):
    if chromium_missing():
        pytest.skip(chromium_missing())
    env, host = slurm["env"], slurm["host"]
    targets = tmp_path / "targets"
    targets.mkdir()
    port = free_port()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    stop_file = tmp_path / "stop"
    prom_cfg = yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES_DIR / "recording.yml")],
        "scrape_configs": [{"job_name": "slurm", "file_sd_configs": [
            {"files": [str(targets / "*.json")], "refresh_interval": "1s"}]}],
    })
    job_env = {**env, "VERLMON": CLI, "VERLMON_PORT": str(port),
               "VERLMON_TARGETS_DIR": str(targets), "VERLMON_DIR": str(tmp_path / "node"),
               "VERLMON_EXPORTER_ARGS": "--gpu-backend sim --scenario healthy --sim-gpus 2 "
                                        "--interval 0.5"}
    out_file = tmp_path / "job.out"
    with start_prometheus(tmp_path / "prom", config_text=prom_cfg) as prom:
        job_id = subprocess.run(
            ["sbatch", "--parsable", "--nodes=1", "--job-name=grpo-e2e", f"--output={out_file}",
             "--export=ALL", str(SBATCH_SCRIPT), sys.executable, str(trainer), str(stop_file)],
            env=job_env, capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip().split(";")[0]
        try:
            # the job's targets reach Prometheus, labelled with the Slurm job name and node
            up = wait_until(lambda: prom.query('up{job="grpo-e2e"} == 1'), 60,
                            what=f"the job's exporter scraped (job {job_id}: "
                                 f"{_job_field(env, job_id, 'JobState')})")
            assert [r["metric"]["node"] for r in up] == [host]
            assert up[0]["metric"]["instance"] == f"{host}:{port}"
            # the exporter on the first node follows the log `verl-monitor run` captures
            steps = wait_until(lambda: [r for r in prom.query(
                'verlmon_training_step{job="grpo-e2e"}') if float(r["value"][1]) >= 3], 60,
                what="training steps from the captured log")
            assert steps[0]["metric"]["node"] == host
            gpus = wait_until(lambda: prom.query(
                'node:verlmon_gpu_sm_active_ratio:avg{job="grpo-e2e"}'), 30,
                what="the recording rules over the job's GPUs")
            assert [r["metric"]["node"] for r in gpus] == [host]
            # the node's GPUs are attributed to the phases of the captured log
            phases = wait_until(lambda: prom.query(
                'verlmon_phase_gpu_seconds_total{job="grpo-e2e",phase="gen"} > 0'), 30,
                what="per-phase GPU counters")
            assert {r["metric"]["gpu"] for r in phases} == {"0", "1"}
            assert list(targets.glob("*.json")), "targets file written while the job runs"
            # the dashboard on this Prometheus lists every node of the job
            assert nodes_shown_by_dashboard(prom.url, tmp_path / "dash", [host]) == [host]
        finally:
            stop_file.touch()
        wait_until(lambda: _job_field(env, job_id, "JobState") in
                   ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 60, what="the job to end")
        assert _job_field(env, job_id, "JobState") == "COMPLETED", out_file.read_text()[-2000:]
        assert _job_field(env, job_id, "ExitCode") == "0:0"
        output = out_file.read_text()
        assert "step:3 " in output  # the command's output passed through to the job's file
        assert "step:3 " in (tmp_path / "node" / "train.log").read_text()
        assert not list(targets.glob("*.json")), "targets must go when the job ends"

        def exporter_gone() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) != 0

        wait_until(exporter_gone, 30, what="the exporter step to stop with the job")
