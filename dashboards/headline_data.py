"""The headline of a source over a window, without Streamlit: what the Overview and the Flags
page lead with (``common.load_headline`` caches it), and what the end-to-end tests read from a
store and from Prometheus at the same moment to compare the two modes.

The numbers are the exporters' own: the ledger each exporter counted step by step (kept in
its run store, and counted into ``verlmon_gpu_seconds_total`` for Prometheus), so both modes
compute :func:`monitor.analysis.headline.headline` from the same GPU-seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from monitor.api import SPAN_STEPS, Flag, Headline, RunEnd, headline


def span_words(run_end: RunEnd | None, start: float, first: float | None, counted: int) -> str:
    """What the span is called: "the last 20 steps" of a live run, "the run" once it finished
    (when the window reaches its start and every step was counted: a Prometheus that began
    scraping after the first steps holds the rest), else "the last N steps"."""
    if run_end is not None:
        whole = (first is None or start <= first + 1.0) and (
            run_end.step is None or counted >= run_end.step)
        return "the run" if whole else f"the last {counted} steps"
    return f"the last {counted} steps" if counted else "the last steps"


def source_headline(source, start: float, end: float, flags: Iterable[Flag],
                    suppress: Mapping[str, Iterable[str]] | None = None,
                    seconds: tuple[dict | None, int] | None = None) -> Headline:
    """The headline of ``source`` (a ``MetricSource``) over ``[start, end]``: the run's end as
    its exporter said it, the ledger of the last ``SPAN_STEPS`` steps (the window's every step
    once the run finished) and the open ``flags``. ``seconds`` (the ledger's GPU-seconds by
    cause and the steps they cover) when the caller has them already."""
    run_end = source.run_end()
    if seconds is None:
        seconds = source.ledger_seconds(start, end, None if run_end is not None else SPAN_STEPS)
    secs, counted = seconds
    rng = source.time_range()
    span = span_words(run_end, start, None if rng is None else rng[0], counted)
    return headline(secs, [f for f in flags if f.end is None], span=span, finished=run_end,
                    suppress=suppress)
