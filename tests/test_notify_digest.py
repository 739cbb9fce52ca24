"""The goodput digest: the sentence, and the exporter's goodput collector posting it to a real
local Slack webhook once per period."""

from __future__ import annotations

from pathlib import Path

from test_notify_slack import Hook, url_file

from exporters.options import ExporterOptions
from monitor.live import ViewContext
from monitor.live.goodput_counter import GoodputCollector
from monitor.notify.digest import by_cause, digest_text, growth
from monitor.notify.slack import SlackNotifier


def test_the_sentence_names_goodput_the_top_three_losses_and_what_is_unexplained():
    secs = {"productive": 6100.0, "rollout_long_tail": 1400.0, "data_loading": 900.0,
            "weight_sync": 500.0, "restarts": 100.0, "unattributed": 1000.0}
    assert digest_text(secs, 6) == (
        "last 6 h: goodput 61%; lost 14% to the rollout long tail, 9% to data loading, "
        "5% to weight sync; 10% unattributed (2.8 GPU-hours)")
    assert digest_text({"productive": 0.0}, 6) is None


def test_growth_is_per_period_and_survives_a_counter_reset():
    before = {"productive": 100.0, "data_loading": 50.0}
    assert growth(before, {"productive": 160.0, "data_loading": 50.0}) == {
        "productive": 60.0, "data_loading": 0.0}
    # the exporter restarted: its counters began again from 0
    assert growth(before, {"productive": 30.0, "data_loading": 5.0}) == {
        "productive": 30.0, "data_loading": 5.0}
    assert by_cause({("n0", 0, "productive"): 1.0, ("n0", 1, "productive"): 2.0,
                     ("n0", 1, "data_loading"): 4.0}) == {"productive": 3.0, "data_loading": 4.0}


def test_the_collector_posts_one_digest_per_period_to_slack(tmp_path: Path):
    hook = Hook()
    try:
        notifier = SlackNotifier(url_file(tmp_path, hook.url), None)
        ctx = ViewContext(node="n0", interval=1.0, notifier=notifier,
                              options=ExporterOptions(slack_digest_hours=6.0))
        col = GoodputCollector(ctx)
        col.totals.add("n0", 0, "productive", 1000.0)
        t0 = 1_800_000_000.0
        assert col.maybe_digest(t0) is None  # the period starts
        col.totals.add("n0", 0, "productive", 6100.0)
        col.totals.add("n0", 0, "data_loading", 3900.0)
        assert col.maybe_digest(t0 + 3600) is None  # not due yet
        text = col.maybe_digest(t0 + 6 * 3600)
        assert text == "last 6 h: goodput 61%; lost 39% to data loading (2.8 GPU-hours)"
        assert col.maybe_digest(t0 + 6 * 3600 + 60) is None  # the next period just began
        assert notifier.deliver() == 1
        (body,) = hook.delivered
        assert "goodput 61%" in body["text"] and body["blocks"][0]["type"] == "header"
    finally:
        hook.close()


def test_without_slack_or_hours_nothing_is_queued():
    ctx = ViewContext(node="n0", interval=1.0,
                          options=ExporterOptions(slack_digest_hours=0.0))
    col = GoodputCollector(ctx)
    assert col.maybe_digest(1.0) is None


def test_the_digest_posts_its_run_name_as_text_never_as_a_mention():
    """Issue 20: the run name (from the command line or a log) is escaped to Slack's rules."""
    from monitor.notify.digest import digest_message

    msg = digest_message("last 6 h: goodput 61% (2.8 GPU-hours)", run="grpo <!channel> & co")
    section = msg["blocks"][1]["text"]["text"]
    assert section == "last 6 h: goodput 61% (2.8 GPU-hours)"
    assert msg["text"] == ("Goodput digest - grpo &lt;!channel&gt; &amp; co: last 6 h: goodput "
                           "61% (2.8 GPU-hours)")
    assert "<!channel>" not in str(msg["text"]) + section
