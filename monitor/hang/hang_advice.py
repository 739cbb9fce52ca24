"""Advice for a hang by where it is stuck, in verl's own keys for the version in the log.

Every key named here exists in verl's source (``HANG_KEYS`` says where it was read); the
general keys (``data.dataloader_num_workers``, ``reward.num_workers``, ...) are also in
``monitor.detect.flag_advice.REAL_KEYS``.
"""

from __future__ import annotations

from monitor.detect.cause_advice import reward_era
from monitor.detect.flag_advice import ADVICE

#: Keys this module names beyond REAL_KEYS, and where in verl-project/verl each was read.
HANG_KEYS: dict[str, str] = {
    "reward.timeout": "verl/experimental/reward_loop/reward_manager/limited.py (main): "
                      "self.timeout = config.reward.get('timeout', 300.0)",
    "reward.reward_manager.name": "verl/trainer/config/_generated_ppo_trainer.yaml (main): "
                                  "reward.reward_manager.name: naive",
    "trainer.default_local_dir": "verl/trainer/config/_generated_ppo_trainer.yaml (main and "
                                 "v0.5.0): checkpoints/${trainer.project_name}/...",
}

_TIMEOUT_NEW = (
    "Bound each compute_score call: verl main's NaiveRewardManager takes "
    "compute_score_timeout (seconds per sample; a sample over it scores 0.0 and training goes "
    "on; verl/workers/reward_manager/naive.py, PR #6673), and the reward loop's "
    "reward.reward_manager.name=rate_limited ends a sample after +reward.timeout seconds "
    "(default 300); reward.num_workers scores in that many workers.")
_TIMEOUT_OLD = (
    "Bound each compute_score call: reward_model.reward_manager=prime scores every sample in a "
    "process pool and gives up on one after 300 s (verl/workers/reward_manager/prime.py); "
    "reward_model.launch_reward_fn_async=True moves the scoring off the driver's thread but "
    "does not bound it.")
_FRAME = ("The frame named is the line that does not return: a regex over a long degenerate "
          "answer, a symbolic comparison or a call that never answers; run compute_score on "
          "that sample alone to see it.")
_HTTP = ("Give the reward function's HTTP calls a timeout (requests.post(..., timeout=30), "
         "httpx.Client(timeout=30)): without one a server that accepts and never answers holds "
         "the driver, and every step, for ever.")
_ROLLOUT_HTTP = ("The driver waits for a rollout server's HTTP answer: check that server's health "
                 "(vLLM and SGLang answer GET /health) and its log; a server that died or hangs "
                 "holds every step.")
_DATA = ("The data loader blocks in the dataset (the frame named): check the storage it reads "
         "from; data.dataloader_num_workers=0 loads in the driver itself, so a stack shows the "
         "exact line, and a worker that died no longer holds the loader.")
_REPLAY = ("The trainer waits for samples that never land in its queue: look at the rollouter "
           "(its process, its log and its servers); async_training.staleness_threshold and "
           "async_training.require_batches set how many samples the trainer waits for.")
_CALL = ("The driver waits on a worker-group call that no worker is running: a worker died or the "
         "call was lost; read the workers' logs (Ray's worker-*.err on their nodes) for an "
         "error, then restart from the last checkpoint (trainer.save_freq sets how much is lost).")
_METHOD = ("A worker's method does not return (its frame is named): the driver and the other "
           "workers wait for it; actor_rollout_ref.nccl_timeout (600 s by default) ends the job "
           "only when the others wait in a collective.")
_GONE = ("A process of the job is gone (killed or crashed): its own log says why. Under "
         "Ray: ray logs worker --pid PID --suffix err (on its node; or its worker-*.err under "
         "/tmp/ray/session_latest/logs); then the kernel's log: dmesg -T | grep -i -e "
         "'out of memory' -e 'killed process' (the OOM killer names the PID it killed: host "
         "memory, not the GPU's, is the usual cause).")
_GONE_WAIT = ("The ranks left wait in the collective for it and will not go on: verl's "
              "actor_rollout_ref.nccl_timeout (600 s by default) ends them; restart from the "
              "last checkpoint (trainer.save_freq sets how much is lost) once the cause is "
              "fixed.")
_CKPT = ("The checkpoint is being written to trainer.default_local_dir: a slow or full file "
         "system there holds save_checkpoint; point it at local disk, or save less often "
         "(trainer.save_freq).")


def reward_timeouts(version: str | None) -> list[str]:
    """The reward timeout sentence(s) for verl's version (both when unknown)."""
    era = reward_era(version)
    if era == "new":
        return [_TIMEOUT_NEW]
    if era == "old":
        return [_TIMEOUT_OLD]
    return [_TIMEOUT_NEW, _TIMEOUT_OLD]


def where_advice(place: str, detail: str = "", version: str | None = None,
                 pid: object = None) -> list[str]:
    """Advice sentences for a process stuck at ``place`` (``monitor.hang.where`` places);
    ``pid``: the process named (a gone one's PID goes into the ``ray logs`` command)."""
    if not place:
        return []  # no place read (no stack): no advice of a place
    if place == "reward":
        http = "HTTP" in detail
        return ([_HTTP] if http else [_FRAME]) + reward_timeouts(version)
    table = {"http": [_ROLLOUT_HTTP], "dataloader": [_DATA], "replay_buffer": [_REPLAY],
             "worker_call": [_CALL], "method": [_METHOD], "checkpoint": [_CKPT],
             "gone": [_GONE, _GONE_WAIT]}
    out = table.get(place, []) + list(ADVICE.get("hang", []))[:1] + (
        [] if place in table else list(ADVICE.get("hang", []))[1:])
    return [a.replace("--pid PID", f"--pid {pid}") for a in out] if pid else out
