"""Flag words that do not contradict themselves (issue 31 item 5): a throughput regression names
the phase that grew; a low_utilization flag never calls the SMs "well used" and gives each
piece of advice once."""

from detect_builders import make_steps

from monitor.analysis import signature as S
from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.flag_advice import advice_for
from monitor.detect.gpu_activity import _signature_words, advice_once
from monitor.detect.step_detectors import detect_throughput_regression
from monitor.frames import empty_gpu_frame, empty_host_frame


def _ctx(steps):
    return make_context(steps, empty_gpu_frame(), empty_host_frame(), [], load_config())


def test_a_regression_names_the_phase_that_grew_and_its_seconds():
    def edit(i, ph):
        if i >= 20:
            ph["gen"] *= 1.6  # generation got slower, the tokens stayed the same

    steps = make_steps(40, edit=edit,
                       throughput=lambda i: 1000.0 * (1 / 1.35 if i >= 20 else 1.0))
    (flag,) = detect_throughput_regression(_ctx(steps))
    base_gen = steps[5].phases["gen"]
    assert f"gen grew most: {base_gen:.1f} s a step in the baseline, " \
           f"{base_gen * 1.6:.1f} s now." in flag.evidence
    # nobody is asked to find the phase the monitor already found; the advice is gen's
    assert not any("see which one grew" in a for a in flag.advice)
    assert any("Profile gen in one step with global_profiler.tool" in a for a in flag.advice)
    assert any("actor_rollout_ref.rollout." in a for a in flag.advice)


def test_a_busy_signature_under_the_healthy_line_is_not_called_well_used():
    sig = S.Signature(name="busy", phase="update_actor", share=1.0, util=98.0, sm=65.0,
                      dram=float("nan"), pcie_bps=float("nan"), cpu_max=float("nan"), n=40)
    words = _signature_words(sig)
    assert "well used" not in words
    assert words == "update_actor came closest to the line, still under it (SM 65%, util 98%)."


def test_low_utilization_advice_gives_the_micro_batch_levers_once():
    table = advice_for("low_utilization", phase="update_actor", signature="busy")
    once = advice_once(table)
    micro = [a for a in once if "ppo_micro_batch_size_per_gpu" in a]
    assert len([a for a in table if "ppo_micro_batch_size_per_gpu" in a]) == 2  # the table
    assert len(micro) == 1 and once[0] == table[0]
