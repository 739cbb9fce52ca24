"""low_utilization on a node that does not follow the verl log (every node but the driver's):
without the phase timeline it cannot tell generation from training, so it judges nothing."""

from detect_builders import make_gpu, make_host, make_steps

from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.gpu_activity import detect_low_utilization


def _node_without_log(gpu):
    """What a non-driver exporter sees: GPU samples, no steps, no phase labels."""
    gpu = gpu.copy()
    return make_context([], gpu, make_host(gpu), [], load_config(), None)


def test_healthy_node_without_the_log_raises_nothing():
    steps = make_steps(30)
    gpu = make_gpu(steps, nodes=("node3",))
    # whole-step SM activity of a healthy run (generation included) sits below the 70% line
    assert gpu["sm_active"].mean() < 70
    assert detect_low_utilization(_node_without_log(gpu)) == []


def test_slow_node_without_the_log_is_left_to_the_cross_node_rules():
    steps = make_steps(30)

    def slow(df):
        df.loc[:, "sm_active"] *= 0.45

    gpu = make_gpu(steps, nodes=("node3",), edit=slow)
    assert detect_low_utilization(_node_without_log(gpu)) == []


def test_the_driver_with_the_timeline_still_judges_training_phases():
    steps = make_steps(30)

    def slow_training(df):
        sel = df["phase"].isin(["old_log_prob", "ref", "update_actor"])
        df.loc[sel, "sm_active"] = 45.0

    gpu = make_gpu(steps, edit=slow_training)
    ctx = make_context(steps, gpu, make_host(gpu), [], load_config(), None)
    flags = detect_low_utilization(ctx)
    assert len(flags) == 1 and "training phases" in flags[0].evidence
