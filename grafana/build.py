"""Generate verl-monitor's Grafana dashboards as code (grafana-foundation-sdk==0.0.21).

Five dashboards, each written as plain dashboard JSON (what Grafana's file provisioning reads)
to ``grafana/dashboards/<uid>.json``:

- **Run overview** (``verlmon-overview``): step, step time, throughput, open flags, phase
  seconds stacked, seconds since the last step.
- **GPUs** (``verlmon-gpus``): NVML utilization, SM/tensor/DRAM activity (GPM), memory, power,
  temperature, NVLink and PCIe throughput (GPM), SM clock, active clock-event (throttle)
  reasons, XID errors.
- **Phases and communication** (``verlmon-phases``): phase seconds and shares of the step,
  weight sync (reshard), rollout wait, communication share, NCCL operations, bytes and bus
  bandwidth per collective.
- **Cluster (nodes)** (``verlmon-cluster``): per-node SM activity against the job's median,
  heat maps by node and by GPU, exporter up, GPUs down, collectors failing, host CPU.
- **Rollout engines** (``verlmon-rollout``): the vLLM / SGLang servers behind verl's agent
  loop: KV cache use, requests running / waiting / paused, preemptions, generated tokens,
  queue time and end-to-end latency, the generation tail (servers still running), sleeping
  engines, and the health of the exporter's scrapes of them.

Every dashboard has the variables ``datasource`` -> ``job`` -> ``node`` -> ``gpu`` (chained
``label_values`` queries; ``job``, ``node`` and ``gpu`` multi-select with ``allValue ".+"``),
every panel a unit and the ``$datasource`` data source, every rate ``[$__rate_interval]``.
Panels read the raw exported metrics (docs/metrics.md), so they work without recording rules.
``job`` is the Prometheus scrape job (one per verl training job) and ``node`` the target label
that prometheus/prometheus.yml gives every exporter.

Usage::

    python grafana/build.py                 # (re)write grafana/dashboards/*.json
    python grafana/build.py --out DIR       # write them elsewhere
    python grafana/build.py --check         # exit 1 if the committed JSON is out of date
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import (
    dashboard,
    prometheus,
    stat,
    statushistory,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    FieldColorModeId,
    VariableRefresh,
    VariableSort,
)

#: Where the committed dashboards live.
DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"

#: Every panel and query reads the data source picked in the ``datasource`` variable.
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

#: Label selectors used by the panels: job+node, and job+node+gpu.
SEL = 'job=~"$job", node=~"$node"'
SEL_GPU = 'job=~"$job", node=~"$node", gpu=~"$gpu"'

TAGS = ["verl-monitor", "generated"]

# Grafana unit ids (the SDK's grafana_foundation_sdk.models.units has the full list).
SECONDS = "s"
RATIO = "percentunit"
BYTES = "bytes"
BYTES_PER_S = "Bps"
WATTS = "watt"
CELSIUS = "celsius"
HERTZ = "hertz"
COUNT = "short"
NONE = "none"
OPS = "ops"
TOKENS_PER_S = "suffix: tok/s"
STEPS_PER_MIN = "suffix: steps/min"
UP_DOWN = "bool_yes_no"


# ----------------------------------------------------------------------------- building blocks


def _query_var(name: str, label: str, query: str) -> dashboard.QueryVariable:
    """A multi-select ``label_values`` variable with an "All" of ``.+``."""
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DS)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
    )


def variables() -> list[dashboard.DatasourceVariable | dashboard.QueryVariable]:
    """The variable chain shared by every dashboard: datasource -> job -> node -> gpu."""
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _query_var("job", "Job", "label_values(verlmon_node_info, job)"),
        _query_var("node", "Node", 'label_values(verlmon_node_info{job=~"$job"}, node)'),
        _query_var(
            "gpu", "GPU", 'label_values(verlmon_gpu_info{job=~"$job", node=~"$node"}, gpu)'
        ),
    ]


def q(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    """A Prometheus query on ``$datasource``; ``instant`` ones come back as a table."""
    query = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DS)
    if instant:
        query = query.instant().format("table")
    return query


def _legend() -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["mean", "lastNotNull", "max"])
    )


def ts(
    title: str,
    unit: str,
    *targets: prometheus.Dataquery,
    description: str = "",
    stacked: bool = False,
    span: int = 12,
    height: int = 8,
    max_value: float | None = None,
) -> timeseries.Panel:
    """A time-series panel with a table legend; ``stacked`` stacks the series (filled)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .min(0)
        .line_width(1)
        .fill_opacity(30 if stacked else 8)
        .show_points(common.VisibilityMode.NEVER)
        .legend(_legend())
        .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        .height(height)
        .span(span)
    )
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    if max_value is not None:
        panel = panel.max(max_value)
    for i, target in enumerate(targets):
        panel = panel.with_target(target.ref_id(chr(ord("A") + i)))
    return panel


def big(
    title: str, unit: str, target: prometheus.Dataquery, description: str = "", span: int = 4
) -> stat.Panel:
    """A stat panel showing the last value, with a sparkline."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .height(4)
        .span(span)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(target.ref_id("A"))
    )


def heat(title: str, unit: str, target: prometheus.Dataquery, description: str = "",
         height: int = 8) -> statushistory.Panel:
    """A heat map with one row per series (a status-history panel coloured by value)."""
    return (
        statushistory.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .min(0)
        .max(1)
        .color_scheme(dashboard.FieldColor().mode(FieldColorModeId.CONTINUOUS_RD_YL_GR))
        .show_value(common.VisibilityMode.NEVER)
        .legend(cb.VizLegendOptions().show_legend(False))
        .height(height)
        .span(24)
        .with_target(target.ref_id("A"))
    )


def _table(title: str, description: str, target: prometheus.Dataquery,
           height: int) -> table.Panel:
    """A full-width table of one query's rows."""
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(NONE)
        .height(height)
        .span(24)
        .with_target(target.ref_id("A"))
    )


def flag_table(title: str, target: prometheus.Dataquery, description: str = "") -> table.Panel:
    """A table of the open detector flags: one row per flag with its scope (node, GPU, phase),
    evidence and advice."""
    return _table(title, description, target, 8).with_transformation(_organize_flags())


def _hang_table(title: str, description: str, target: prometheus.Dataquery,
                hidden: tuple[str, ...], order: tuple[str, ...],
                rename: dict[str, str]) -> table.Panel:
    """A full-width table of one instant info query: ``hidden`` columns left out, the others
    in ``order``, renamed by ``rename``."""
    return _table(title, description, target, 6).with_transformation(DataTransformerConfig(
        id_val="organize",
        options={"excludeByName": dict.fromkeys(hidden, True),
                 "indexByName": {name: i for i, name in enumerate(order)},
                 "renameByName": rename}))


def where_table(target: prometheus.Dataquery) -> table.Panel:
    """Where each process of a silent job is: the exporters' last py-spy round."""
    return _hang_table(
        "Where each process is",
        "The last py-spy round of each exporter in a silence: every local process "
        "of the job (driver, workers) with its role, the place it is in (reward, "
        "worker_call, http, dataloader, checkpoint, validation, collective, "
        "ray_idle ...), the phase and the deepest frame of the user's or verl's "
        "code; value 1 marks the process named as stuck "
        "(verlmon_hang_where_info; docs/hangs.md). Empty while steps arrive.",
        target, ("Time", "__name__"),
        ("job", "node", "role", "pid", "place", "phase", "frame", "Value"), {"Value": "stuck"})


def culprit_table(target: prometheus.Dataquery) -> table.Panel:
    """Who holds a hung job: one row per rank the exporters' dump rounds named."""
    return _hang_table(
        "Who is stuck",
        "When a job hangs each exporter takes py-spy stacks of the job's processes "
        "(on by default) and asks its ranks for their Flight Recorder (--fr-dir): "
        "the process stuck (the driver scoring rewards, a worker method that never "
        "returns, a rank outside the collective the others wait in) is named here "
        "with its PID and the deepest frame of the user's or verl's code "
        "(verlmon_hang_culprit_info; docs/hangs.md). Empty while nothing hangs.",
        target, ("Time", "Value", "__name__"),
        ("job", "node", "rank", "pid", "gpu", "collective", "seq", "frame"), {})


def _organize_flags() -> DataTransformerConfig:
    """Put job, node, severity, kind, GPU, phase, evidence and advice in that order; hide time,
    value, instance and the exporter's own node label (``exported_node``)."""
    return DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True, "Value": True, "__name__": True, "instance": True,
                              "exported_node": True},
            "indexByName": {"job": 0, "node": 1, "severity": 2, "kind": 3, "gpu": 4,
                            "phase": 5, "evidence": 6, "advice": 7},
            "renameByName": {},
        },
    )


def _dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("verl-monitor")
            .type("dashboards")
            .tags(["verl-monitor"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for var in variables():
        board = board.with_variable(var)
    return board


def _per_job(metric: str, by: str = "") -> prometheus.Dataquery:
    """``metric`` of each job on the dashboard's selection (its largest value), a line per job,
    or with ``by`` (a label) a line per value of that label."""
    if not by:
        return q(f"max by (job) ({metric}{{{SEL}}})", "{{job}}")
    return q(f"max by (job, {by}) ({metric}{{{SEL}}})", f"{{{{{by}}}}}")


def _with_panels(board: dashboard.Dashboard, row: str,
                 panels: Iterable[Any]) -> dashboard.Dashboard:
    """``board`` with the row ``row`` and then ``panels`` in order."""
    board = board.with_row(dashboard.Row(row))
    for panel in panels:
        board = board.with_panel(panel)
    return board


# ------------------------------------------------------------------------------ the dashboards


def _overview_now(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Overview, row Now: the last step, its time and throughput, open flags."""
    return _with_panels(board, "Now", (
        big("Step", NONE, _per_job("verlmon_training_step"),
            "Last training step seen in the trainer's log."),
        big("Last step time", SECONDS, _per_job("verlmon_step_duration_seconds"),
            "The last step's total seconds (timing_s/step)."),
        big("Last throughput per GPU", TOKENS_PER_S,
            _per_job("verlmon_throughput_tokens_per_second"),
            "perf/throughput as verl reports it: tokens per second per GPU."),
        big("Open flags", COUNT,
            q(f"count(verlmon_flag_active{{{SEL}}} == 1) or vector(0)", "open"),
            "Detector flags open now, all kinds and severities."),
        big("Critical flags", COUNT,
            q(f'count(verlmon_flag_active{{{SEL}, severity="critical"}} == 1) '
              "or vector(0)", "critical"),
            "Open flags of severity critical."),
        big("Since last step", SECONDS, _per_job("verlmon_seconds_since_last_step"),
            "Seconds since the last step ended: grows without bound when the "
            "run is stalled."),
        big("Mean step time (range)", SECONDS,
            q(f"sum by (job) (increase(verlmon_step_seconds_sum{{{SEL}}}[$__range]))"
              f" / (sum by (job) (increase(verlmon_step_seconds_count{{{SEL}}}"
              "[$__range])) > 0)", "{{job}}"),
            "Step seconds over steps in the dashboard's time range, from the "
            "counters: every step counts, also those between two scrapes.",
            span=12),
        big("Data wait share (range)", RATIO,
            q(f"sum by (job) (increase(verlmon_data_wait_seconds_total{{{SEL}}}"
              "[$__range])) / ((sum by (job) (increase(verlmon_step_seconds_sum"
              f"{{{SEL}}}[$__range])) + sum by (job) (increase("
              f"verlmon_data_wait_seconds_total{{{SEL}}}[$__range]))) > 0)",
              "{{job}}"),
            "Share of the time range spent fetching the next batch before the "
            "step timer starts (no verl timer covers it).", span=12),
    ))


def _overview_goodput(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Overview, row Goodput: the GPU-seconds by cause."""
    return _with_panels(board, "Goodput: where the GPU time went", (
        big("Goodput (range)", RATIO,
            q(f"sum by (job) (increase(verlmon_gpu_seconds_total{{{SEL},"
              'cause="productive"}[$__range])) / (sum by (job) (increase('
              f"verlmon_gpu_seconds_total{{{SEL}}}[$__range])) > 0)", "{{job}}"),
            "Share of the GPU-seconds in the time range spent productive (compute "
            "phases at the run's own activity); the rest is lost by cause "
            "(docs/goodput.md).", span=6),
        ts("GPU-seconds by cause (stacked share)", RATIO,
           q(f"sum by (job, cause) (rate(verlmon_gpu_seconds_total{{{SEL}}}"
             "[$__rate_interval])) / on (job) group_left () (sum by (job) (rate("
             f"verlmon_gpu_seconds_total{{{SEL}}}[$__rate_interval])) > 0)",
             "{{cause}}"),
           description="Each cause's share of the GPU time paid for: productive, "
                       "each cause of loss, and what no rule explains "
                       "(unattributed). The stack sums to 1.",
           stacked=True),
    ))


def _overview_steps(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Overview, row Steps: steps, phases and flags over time."""
    return _with_panels(board, "Steps", (
        ts("Step time", SECONDS, _per_job("verlmon_step_duration_seconds"),
           description="Seconds per training step."),
        ts("Throughput per GPU", TOKENS_PER_S, _per_job("verlmon_throughput_tokens_per_second"),
           description="perf/throughput: tokens per second per GPU."),
        ts("Phase seconds (stacked)", SECONDS, _per_job("verlmon_phase_duration_seconds", "phase"),
           description="The last step's seconds per canonical phase, stacked: "
                       "the stack's height is the step time.",
           stacked=True),
        ts("Steps per minute", STEPS_PER_MIN,
           q(f"sum by (job) (rate(verlmon_training_steps_total{{{SEL}}}"
             "[$__rate_interval])) * 60", "{{job}}"),
           description="Step records parsed per minute."),
        ts("Seconds since last step", SECONDS, _per_job("verlmon_seconds_since_last_step"),
           description="A saw-tooth while the run steps; a ramp when it stalls."),
        ts("Open flags by kind", COUNT,
           q(f"sum by (job, kind, severity) (verlmon_flag_active{{{SEL}}})",
             "{{kind}} ({{severity}})"),
           description="Detector flags open over time.", stacked=True),
    ))


def _overview_flags(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Overview, row Flags: the open flags' words and the hang tables."""
    return _with_panels(board, "Flags", (
        flag_table(
            "Open flags with evidence",
            q("max by (job, node, exported_node, severity, kind, gpu, phase, evidence, advice) "
              f"(verlmon_flag_info{{{SEL}}})", instant=True),
            "Every open flag with its node, GPU and phase, the detector's whole evidence and "
            "advice, a line per piece (verlmon_flag_info: the words of the dashboard and Slack).",
        ),
        culprit_table(
            q("max by (job, node, instance, rank, pid, gpu, collective, seq, frame) "
              f"(verlmon_hang_culprit_info{{{SEL}}})", instant=True)),
        where_table(
            q("max by (job, node, instance, role, pid, place, phase, frame) "
              f"(verlmon_hang_where_info{{{SEL}}})", instant=True)),
    ))


#: The legend of a per-GPU series.
GPU_LEGEND = "{{node}} gpu{{gpu}}"


def _gpu_series(title: str, unit: str, metric: str, description: str,
                **options: Any) -> timeseries.Panel:
    """A time series of one per-GPU metric on the dashboard's $job, $node and $gpu, a line
    per GPU; ``options`` go to :func:`ts`."""
    return ts(title, unit, q(f"{metric}{{{SEL_GPU}}}", GPU_LEGEND), description=description,
              **options)


#: GPUs, row Activity: (title, metric, description) of each share of time (0 to 1).
_GPU_ACTIVITY: tuple[tuple[str, str, str], ...] = (
    ("NVML utilization", "verlmon_gpu_utilization_ratio",
     "Share of time a kernel was running: overstates how busy the SMs are (compare SM active)."),
    ("SM active (GPM)", "verlmon_gpu_sm_active_ratio",
     "Share of SMs busy: the honest activity signal."),
    ("Tensor pipes active (GPM)", "verlmon_gpu_tensor_active_ratio",
     "Any tensor-core pipe active."),
    ("DRAM bandwidth active (GPM)", "verlmon_gpu_dram_active_ratio",
     "Share of peak memory bandwidth in use."),
)

#: GPUs, row Interconnect: (title, the link as the metric names say it, description).
_GPU_LINKS: tuple[tuple[str, str, str], ...] = (
    ("NVLink throughput (GPM)", "nvlink",
     "Bytes per second over all NVLinks: collectives and weight sync inside a node."),
    ("PCIe throughput (GPM)", "pcie",
     "Bytes per second over PCIe: host transfers, offload, data loading."),
)


def _gpus_activity(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """GPUs, row Activity: NVML utilization and the GPM ratios."""
    return _with_panels(board, "Activity", (
        _gpu_series(title, RATIO, metric, description, max_value=1)
        for title, metric, description in _GPU_ACTIVITY))


def _gpus_memory_power(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """GPUs, row Memory, power, heat."""
    used = "verlmon_gpu_memory_used_bytes"
    return _with_panels(board, "Memory, power, heat", (
        _gpu_series("Memory used", BYTES, used, "Framebuffer memory in use."),
        ts("Memory used share", RATIO,
           q(f"{used}{{{SEL_GPU}}} / (verlmon_gpu_memory_total_bytes{{{SEL_GPU}}} > 0)",
             GPU_LEGEND),
           description="Used / total framebuffer memory; near 1 means OOM risk.", max_value=1),
        _gpu_series("Memory growth (memory_creep)", BYTES_PER_S,
                    f"instance_gpu:{used}:deriv10m",
                    "How fast each GPU's memory grows (deriv over 10 minutes): a line that stays "
                    "above 0 step after step is a leak; the memory_creep flag forecasts when it "
                    "reaches the capacity."),
        _gpu_series("Time to full at this rate", SECONDS, f"instance_gpu:{used}:seconds_to_full",
                    "Free memory / growth rate: the memory_creep forecast as Prometheus sees it "
                    "(no line while memory does not grow)."),
        _gpu_series("Power", WATTS, "verlmon_gpu_power_watts", "Power draw."),
        _gpu_series("Temperature", CELSIUS, "verlmon_gpu_temperature_celsius",
                    "GPU core temperature."),
    ))


def _gpus_interconnect(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """GPUs, row Interconnect: NVLink and PCIe, each transmitted and received."""
    return _with_panels(board, "Interconnect", (
        ts(title, BYTES_PER_S,
           *(q(f"verlmon_gpu_{link}_{way}_bytes_per_second{{{SEL_GPU}}}", f"{GPU_LEGEND} {short}")
             for way, short in (("transmit", "tx"), ("receive", "rx"))),
           description=description)
        for title, link, description in _GPU_LINKS))


def _gpus_clocks(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """GPUs, row Clocks, throttling, errors."""
    return _with_panels(board, "Clocks, throttling, errors", (
        _gpu_series("SM clock", HERTZ, "verlmon_gpu_sm_clock_hertz",
                    "SM clock; drops with throttling."),
        ts("Clock-event reasons active", COUNT,
           q(f"max by (node, gpu, reason) (verlmon_gpu_clock_event_active{{{SEL_GPU}}}) > 0",
             f"{GPU_LEGEND} {{{{reason}}}}"),
           description="Throttle reasons active now (1 while active); idle and "
                       "application-clock reasons are normal, thermal and power "
                       "slowdowns are not.", max_value=1),
        ts("XID errors", COUNT,
           q(f"sum by (node, gpu, xid) (increase(verlmon_gpu_xid_errors_total{{{SEL_GPU}}}"
             "[$__rate_interval]))", f"{GPU_LEGEND} xid {{{{xid}}}}"),
           description="XID events from the driver (48/63/64/94/95: memory errors; "
                       "79: fell off the bus)."),
        big("XID errors in range", COUNT,
            q(f"sum(increase(verlmon_gpu_xid_errors_total{{{SEL_GPU}}}[$__range])) "
              "or vector(0)", "xid"),
            "XID events in the dashboard's time range, every GPU shown.", span=12),
    ))


def _phases(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Phases and communication: where the step's time goes."""
    share = (f"verlmon_phase_duration_seconds{{{SEL}}} / ignoring (phase) group_left () "
             f"(verlmon_step_duration_seconds{{{SEL}}} > 0)")
    range_share = (f"sum by (job, phase) (increase(verlmon_phase_seconds_total{{{SEL}}}"
                   "[$__range])) / on (job) group_left () (sum by (job) (increase("
                   f"verlmon_step_seconds_sum{{{SEL}}}[$__range])) > 0)")
    comm = (f'verlmon_phase_duration_seconds{{{SEL}, phase="comm"}} / ignoring (phase) '
            f"(verlmon_step_duration_seconds{{{SEL}}} > 0)")
    board = _with_panels(board, "Phases", (
        ts("Phase seconds", SECONDS, _per_job("verlmon_phase_duration_seconds", "phase"),
           description="The last step's seconds per canonical phase."),
        ts("Phase share of the step", RATIO,
           q(f"max by (job, phase) ({share})", "{{phase}}"),
           description="The last step's phase seconds / step seconds, stacked "
                       "(sums to about 1).",
           stacked=True, max_value=1),
        big("Phase share over the time range", RATIO,
            q(range_share, "{{phase}}"),
            "Phase seconds / step seconds summed over every step in the "
            "dashboard's time range (the counters: exact, whatever the scrapes "
            "missed).", span=24),
        ts("Weight sync (reshard)", SECONDS,
           q(f'max by (job) (verlmon_phase_duration_seconds{{{SEL}, '
             'phase="reshard"})', "reshard {{job}}"),
           description="Trainer -> rollout weight sync per step; spikes point at "
                       "resharding or memory pressure."),
        ts("Rollout wait", SECONDS,
           q(f'max by (job) (verlmon_phase_duration_seconds{{{SEL}, '
             'phase="rollout_wait"})', "rollout_wait {{job}}"),
           description="Trainer waiting for rollouts (logged by async/fork "
                       "trainers and the breakdown format)."),
    ))
    return _with_panels(board, "Communication", (
        ts("Communication share", RATIO,
           q(f"max by (job) ({comm})", "log {{job}}"),
           q(f"max by (job, node) (verlmon_nccl_comm_share_ratio{{{SEL}}})",
             "NCCL {{node}}"),
           description="comm / step from the log's comm timer, and NCCL "
                       "execution seconds per rank / wall seconds (Inspector).",
           max_value=1),
        ts("NCCL operations by collective", OPS,
           q(f"sum by (job, coll) (rate(verlmon_nccl_operations_total{{{SEL}}}"
             "[$__rate_interval]))", "{{coll}}"),
           description="Collectives per second (NCCL Inspector)."),
        ts("NCCL bytes by collective", BYTES_PER_S,
           q(f"sum by (job, coll) (rate(verlmon_nccl_bytes_total{{{SEL}}}"
             "[$__rate_interval]))", "{{coll}}"),
           description="Message bytes per second per collective type."),
        ts("NCCL bus bandwidth", BYTES_PER_S,
           q(f"max by (job, node, coll, comm) "
             f"(verlmon_nccl_bus_bandwidth_bytes_per_second{{{SEL}}})",
             "{{node}} {{coll}} {{comm}}"),
           description="Latest bus bandwidth per collective and communicator; "
                       "compare with the link's peak."),
    ))


def _cluster(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Cluster (nodes): which node lags, and is every exporter and GPU up."""
    # from the exporters' activity counters: exact at any scrape interval (issue 24)
    node_sm = (f"sum by (job, node) (rate(verlmon_gpu_sm_active_seconds_total{{{SEL}}}"
               f"[$__rate_interval])) / (sum by (job, node) (rate("
               f"verlmon_gpu_sampled_seconds_total{{{SEL}}}[$__rate_interval])) > 0)")
    gpu_sm = (f"rate(verlmon_gpu_sm_active_seconds_total{{{SEL_GPU}}}[$__rate_interval]) / "
              f"(rate(verlmon_gpu_sampled_seconds_total{{{SEL_GPU}}}[$__rate_interval]) > 0)")
    job_median = ('quantile by (job) (0.5, rate(verlmon_gpu_sm_active_seconds_total'
                  '{job=~"$job"}[$__rate_interval]) / (rate(verlmon_gpu_sampled_seconds_total'
                  '{job=~"$job"}[$__rate_interval]) > 0))')
    board = _with_panels(board, "Activity by node", (
        ts("SM active per node vs job median", RATIO,
           q(node_sm, "{{node}}"),
           q(job_median, "median {{job}}"),
           description="Mean SM activity of each node's GPUs over every sample, "
                       "and the median over every GPU of the job: the slow node "
                       "sits above it, the nodes waiting for it below.",
           max_value=1),
        ts("Node SM activity / job median", RATIO,
           q(f"{node_sm} / on (job) group_left () ({job_median} > 0)", "{{node}}"),
           description="1 = as busy as the job's median GPU; the slow node the "
                       "others wait for stays well above 1 (NodeImbalance at "
                       "1.2)."),
        heat("SM active heat map by node", RATIO, q(node_sm, "{{node}}"),
             "One row per node, coloured by mean SM activity."),
        heat("SM active heat map by GPU", RATIO,
             q(gpu_sm, "{{node}} gpu{{gpu}}"),
             "One row per GPU, coloured by SM activity over every sample: the "
             "straggler is the hot row.", height=10),
    ))
    return _with_panels(board, "Health", (
        ts("Exporter up", UP_DOWN,
           q(f"up{{{SEL}}}", "{{node}} {{instance}}"),
           description="1 while Prometheus scrapes the node's exporter.",
           span=8, max_value=1),
        ts("GPUs down", COUNT,
           q(f"sum by (job, node) (1 - verlmon_gpu_up{{{SEL}}})", "{{node}}"),
           description="GPUs whose NVML calls fail, per node.", span=8),
        ts("Collectors failing", COUNT,
           q(f"count by (job, node) (verlmon_collector_success{{{SEL}}} == 0) "
             f"or sum by (job, node) (verlmon_collector_success{{{SEL}}} * 0)",
             "{{node}}"),
           description="Collectors whose last run failed, per node (the reason is "
                       "in the exporter's log).", span=8),
        ts("Host CPU busiest core", RATIO, _per_job("verlmon_host_cpu_max_core_ratio", "node"),
           description="A busiest core near 1 with idle GPUs: a CPU-bound data "
                       "loader or reward function.", max_value=1),
        ts("Host CPU iowait", RATIO, _per_job("verlmon_host_cpu_iowait_ratio", "node"),
           description="Share of CPU time waiting for IO: IO starvation.",
           max_value=1),
    ))


def _rollout(board: dashboard.Dashboard) -> dashboard.Dashboard:
    """Rollout engines: is the KV cache full, do requests queue or preempt, is there a tail."""
    by_server = "job, node, server"

    def mean_of(summary: str) -> str:
        return (f"sum by ({by_server}) (rate({summary}_sum{{{SEL}}}[$__rate_interval])) / "
                f"(sum by ({by_server}) (rate({summary}_count{{{SEL}}}[$__rate_interval])) "
                "> 0)")

    running = f'verlmon_rollout_requests{{{SEL}, state="running"}}'
    board = _with_panels(board, "Engines", (
        ts("KV cache use per server", RATIO,
           q(f"max by ({by_server}) (verlmon_rollout_kv_cache_usage_ratio{{{SEL}}})",
             "{{node}} {{server}}"),
           description="Share of each server's KV cache in use; near 1 the engine "
                       "preempts requests (raise gpu_memory_utilization or lower "
                       "max_num_seqs).", max_value=1),
        ts("Requests by state", COUNT,
           q(f"sum by (job, state) (verlmon_rollout_requests{{{SEL}}})",
             "{{state}}"),
           description="Requests running, waiting (queued) and paused (during a "
                       "weight sync), summed over the pool's servers."),
        ts("Preemptions per second", OPS,
           q(f"sum by ({by_server}) (rate(verlmon_rollout_preemptions_total"
             f"{{{SEL}}}[$__rate_interval]))", "{{node}} {{server}}"),
           description="Requests evicted for lack of KV cache and recomputed "
                       "later (SGLang: retractions)."),
        ts("Generation tokens per second", TOKENS_PER_S,
           q(f"sum by (job, node) (rate(verlmon_rollout_generation_tokens_total"
             f"{{{SEL}}}[$__rate_interval]))", "{{node}}"),
           description="Tokens the node's engines generate per second."),
        ts("Generation tail: servers running", COUNT,
           q(f"count by (job) ({running} >= 1) or sum by (job) ({running} * 0)",
             "servers with a request {{job}}"),
           q(f"sum by (job) ({running})", "requests running {{job}}"),
           description="Servers that still run a request, and the pool's running "
                       "requests: a long stretch with one server and a few "
                       "requests is the generation tail."),
        ts("Engines asleep", COUNT,
           q(f"sum by (job, node) (verlmon_rollout_sleeping{{{SEL}}})", "{{node}}"),
           description="Engines in sleep mode (colocated engines sleep while the "
                       "trainer trains; vLLM 0.11+ reports it)."),
        ts("Mean queue time", SECONDS,
           q(mean_of("verlmon_rollout_queue_time_seconds"), "{{node}} {{server}}"),
           description="Mean seconds a finished request waited in the engine's "
                       "queue."),
        ts("Mean end-to-end latency", SECONDS,
           q(mean_of("verlmon_rollout_e2e_latency_seconds"), "{{node}} {{server}}"),
           description="Mean seconds from arrival to the last token of a finished "
                       "request."),
    ))
    return _with_panels(board, "Scrape health", (
        ts("Engine servers up", UP_DOWN,
           q(f"max by ({by_server}) (verlmon_rollout_server_up{{{SEL}}})",
             "{{node}} {{server}}"),
           description="1 while the exporter reads the server's /metrics.",
           span=8, max_value=1),
        ts("Engine scrape duration", SECONDS,
           q(f"max by ({by_server}) (verlmon_rollout_scrape_duration_seconds"
             f"{{{SEL}}})", "{{node}} {{server}}"),
           description="Seconds the exporter's last read of each server took.",
           span=8),
        ts("Engine scrape errors", OPS,
           q(f"sum by (job, node, reason) (rate(verlmon_rollout_scrape_errors_total"
             f"{{{SEL}}}[$__rate_interval]))", "{{node}} {{reason}}"),
           description="Failed reads per second by reason (timeout, connect, "
                       "http, garbage).", span=8),
    ))


#: A row builder: the dashboard with one or more rows added.
Rows = Callable[[dashboard.Dashboard], dashboard.Dashboard]


@dataclass(frozen=True)
class Board:
    """One generated dashboard: its uid (also the file name), title, description and the
    builders of its rows, in order."""

    uid: str
    title: str
    description: str
    rows: tuple[Rows, ...]

    def build(self) -> dashboard.Dashboard:
        """The dashboard: the settings and variables every board shares, then its rows."""
        board = _dashboard(self.uid, self.title, self.description)
        for rows in self.rows:
            board = rows(board)
        return board


BOARDS: tuple[Board, ...] = (
    Board("verlmon-overview", "verl-monitor / Run overview",
          "Is the verl job stepping, how fast, and which detector flags are open.",
          (_overview_now, _overview_goodput, _overview_steps, _overview_flags)),
    Board("verlmon-gpus", "verl-monitor / GPUs",
          "Per-GPU activity (NVML and GPM), memory, power, temperature, clocks, throttling "
          "and XID errors.",
          (_gpus_activity, _gpus_memory_power, _gpus_interconnect, _gpus_clocks)),
    Board("verlmon-phases", "verl-monitor / Phases and communication",
          "Where each step's time goes: phase seconds and shares, weight sync, rollout "
          "wait, and NCCL collectives.", (_phases,)),
    Board("verlmon-cluster", "verl-monitor / Cluster (nodes)",
          "Per-node SM activity against the job's median, heat maps, and exporter and GPU "
          "health.", (_cluster,)),
    Board("verlmon-rollout", "verl-monitor / Rollout engines",
          "The vLLM / SGLang servers behind verl's agent loop (server-mode rollout): KV "
          "cache, requests, preemptions, tokens, latency, the generation tail, scrape "
          "health.", (_rollout,)),
)


def render(board: Board) -> str:
    """The dashboard's JSON text: sorted keys, two-space indent, a final newline."""
    return JSONEncoder(sort_keys=True, indent=2).encode(board.build().build()) + "\n"


def write_all(out_dir: Path) -> list[Path]:
    """Write every dashboard to ``out_dir/<uid>.json``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for board in BOARDS:
        path = out_dir / f"{board.uid}.json"
        path.write_text(render(board), encoding="utf-8")
        paths.append(path)
    return paths


def stale_files(out_dir: Path) -> list[str]:
    """Names of the dashboards in ``out_dir`` that differ from (or lack) the generated JSON."""
    stale = []
    for board in BOARDS:
        path = out_dir / f"{board.uid}.json"
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != render(board):
            stale.append(path.name)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Command line: write the dashboards, or ``--check`` that the committed ones are current."""
    parser = argparse.ArgumentParser(
        prog="python grafana/build.py",
        description="Generate verl-monitor's Grafana dashboards (plain JSON for provisioning).",
    )
    parser.add_argument("--out", type=Path, default=DASHBOARD_DIR,
                        help=f"folder to write <uid>.json into (default {DASHBOARD_DIR})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a dashboard in --out is missing or out "
                             "of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"out of date in {args.out}: {', '.join(stale)} "
                  "(run: python grafana/build.py)", file=sys.stderr)
            return 1
        print(f"{len(BOARDS)} dashboards in {args.out} are up to date")
        return 0
    try:
        paths = write_all(args.out)
    except OSError as exc:
        print(f"cannot write dashboards to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
