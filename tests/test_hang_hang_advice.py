"""monitor/hang/hang_advice.py: advice by where a hang is stuck, in verl's real keys by version."""

from __future__ import annotations

import pytest

from monitor.detect.flag_advice import REAL_KEYS, named_keys
from monitor.hang.hang_advice import HANG_KEYS, where_advice

PLACES = ("reward", "http", "dataloader", "replay_buffer", "worker_call", "method",
          "checkpoint", "collective", "gone", "unknown")


@pytest.mark.parametrize("version", ["0.4.1-0.5.x", "0.8+", None])
@pytest.mark.parametrize("place", PLACES)
def test_every_key_named_exists_in_verl(place, version):
    text = " ".join(where_advice(place, "", version) + where_advice(place, "(HTTP)", version))
    assert text
    code = ("requests.", "httpx.")  # Python calls and file names, not config keys
    unknown = [k for k in named_keys(text) if k not in REAL_KEYS and k not in HANG_KEYS
               and not k.endswith(".py") and not k.startswith(code)]
    assert unknown == [], unknown


def test_each_place_gets_its_own_first_lever():
    assert "compute_score_timeout" in where_advice("reward", "", "0.8+")[1]
    assert "reward_model.reward_manager=prime" in where_advice("reward", "", "0.4.1-0.5.x")[1]
    assert where_advice("reward", "(compute_score waits for an HTTP answer)")[0].startswith(
        "Give the reward function's HTTP calls a timeout")
    assert "data.dataloader_num_workers" in where_advice("dataloader")[0]
    assert "trainer.default_local_dir" in where_advice("checkpoint")[0]
    assert "GET /health" in where_advice("http")[0]
    assert where_advice("collective")[0].startswith("Look at the rank named")
    gone = " ".join(where_advice("gone"))
    assert "ray logs worker --pid PID --suffix err" in gone and "dmesg" in gone
    assert "actor_rollout_ref.nccl_timeout" in gone
    assert "ray logs worker --pid 4321 --suffix err" in where_advice("gone", pid=4321)[0]
