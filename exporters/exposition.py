"""The /metrics text: every collector's families plus the exporter's identity and health.

:class:`Exposition` wraps every enabled collector's ``collect()``: each is timed and isolated,
so a collector that raises (or yields a family that cannot be written) is reported as
``verlmon_collector_success{collector} 0`` with its error counted and logged once in words,
and the rest of the scrape is served. It adds ``verlmon_build_info``, ``verlmon_node_info`` and
the collectors' health, then the families of every part that reports on itself (``extra``: the
store writer's ``verlmon_store_up``, Slack, the server, ...). Nothing from the command line,
the environment or the web config reaches a label or a value.

:func:`format_families` writes text format 0.0.4 itself: the same bytes as prometheus_client's
``generate_latest`` for the families collectors build, and a whole 64-GPU scrape 1.6-3.3x
cheaper (``bench/exporter.py --exposition``: prometheus-client 13-19 ms, over the 10 ms budget;
so our writer stays); with ``openmetrics=True`` the same bytes as prometheus_client's
OpenMetrics writer, which costs 3-10x ours. :func:`negotiate` picks the format from the
scrape's Accept header the way prometheus_client's ``choose_encoder`` does;
:meth:`Exposition.render` takes the ``name[]`` filter of the scrape's URL (only the families
that have a sample of those names). A label value longer than ``MAX_LABEL_CHARS`` (a log
path, a communicator name from a dump) is written shortened, with a digest that keeps distinct
values distinct, and counted (``verlmon_label_values_truncated_total``): one runaway string
cannot make a scrape hundreds of megabytes.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_exposition

from exporters.registry import BaseCollector
from monitor import metric_names as m
from monitor.printable import printable

log = logging.getLogger("verl_monitor.exporter")

#: The Prometheus text format our bytes follow.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
#: The OpenMetrics text format, for scrapers that ask for it (Prometheus does by default).
OPENMETRICS_CONTENT_TYPE = om_exposition.CONTENT_TYPE_LATEST
_OM_EOF = "# EOF\n"

_TYPE_NAMES = {"unknown": "untyped", "stateset": "gauge", "gaugehistogram": "histogram",
               "info": "gauge"}
_DEFERRED = ("_created", "_gsum", "_gcount")
#: Longest label value written; longer ones (log- and dump-derived text) are shortened.
MAX_LABEL_CHARS = 128
#: Labels written whole up to ``TEXT_LABEL_CHARS``: a flag's evidence and advice
#: (``verlmon_flag_info``), which readers of Prometheus show as the flag's words.
TEXT_LABELS = frozenset({"evidence", "advice"})
TEXT_LABEL_CHARS = 4096


def _value(v: float) -> str:
    v = float(v)
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "+Inf" if v > 0 else "-Inf"
    text = repr(v)
    point = text.find(".")
    if v > 0 and point > 6:  # large numbers in exponent form, as Go (and Prometheus) write them
        digits = (text[:point] + text[point + 1:]).rstrip("0")
        mantissa = f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits
        return f"{mantissa}e+{point - 1:02d}"
    return text


def _label_value(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def shorten_label(value: str, limit: int = MAX_LABEL_CHARS) -> str:
    """``value`` when at most ``limit`` characters, else its start, ``...#`` and 10 hex digits
    of its SHA-256, ``limit`` characters in all: distinct long values stay distinct series."""
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{value[:limit - 14]}...#{digest}"


class LabelWriter:
    """The label sets one exposition writes: their rendered text (the same few hundred repeat
    on every scrape) and how many samples it wrote with a shortened value. Each
    :class:`Exposition` owns one, so two exporters in one process never share a count."""

    def __init__(self) -> None:
        self.cache: dict[tuple, str] = {}
        #: Samples written with a shortened label value (counted at every scrape).
        self.truncated = 0

    def text(self, key: tuple) -> str:
        """The ``k="v",...`` text of one label set (``tuple(labels.items())``), long values
        shortened and counted; the cache never keeps a long value alive."""
        inner = self.cache.get(key)
        if inner is not None:
            return inner
        # text from logs and dumps shown inert: escapes and invisible characters as escapes
        values = [printable(v) for _, v in key]
        short = [shorten_label(v, TEXT_LABEL_CHARS if k in TEXT_LABELS else MAX_LABEL_CHARS)
                 for (k, _), v in zip(key, values, strict=True)]
        inner = ",".join(f'{k}="{_label_value(v)}"'
                         for k, v in sorted(zip((k for k, _ in key), short, strict=True)))
        if short != values:
            self.truncated += 1
        else:
            if len(self.cache) > 50_000:  # bounded: label sets change rarely
                self.cache.clear()
            self.cache[key] = inner
        return inner


def qvalues(header: str | None) -> dict[str, float]:
    """Each name of an Accept or Accept-Encoding header (lower case, parameters other than q
    dropped) with its q-value, 0..1 (1 when not given; the highest when named twice)."""
    out: dict[str, float] = {}
    for item in (header or "").split(","):
        name, *params = (part.strip() for part in item.split(";"))
        if not name:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = min(1.0, max(0.0, float(value)))
                except ValueError:
                    q = 0.0
                if q != q:  # NaN
                    q = 0.0
        name = name.lower()
        out[name] = max(out.get(name, 0.0), q)
    return out


def negotiate(accept: str | None) -> tuple[bool, str]:
    """(OpenMetrics?, content type) for a scrape's Accept header: OpenMetrics when it names
    ``application/openmetrics-text`` with a q-value above 0 and not below text/plain's, else
    text format 0.0.4 (prometheus_client picks OpenMetrics when it is named at all)."""
    weights = qvalues(accept)
    om = weights.get("application/openmetrics-text", 0.0)
    if om > 0 and om >= weights.get("text/plain", 0.0):
        return True, OPENMETRICS_CONTENT_TYPE
    return False, CONTENT_TYPE


def format_families(families: Iterable[Metric], openmetrics: bool = False,
                    labels: LabelWriter | None = None) -> bytes:
    """Text format 0.0.4 for ``families``: the same bytes as prometheus_client's
    ``generate_latest`` for plain gauge/counter/info families, several times faster.

    With ``openmetrics``, the OpenMetrics 1.0 text of the same families (the bytes of
    prometheus_client's OpenMetrics writer, without the final ``# EOF`` line: the caller ends
    the whole exposition with :data:`EOF`). Families with exemplars, timestamps or
    ``_created``-style samples go through prometheus_client's writers unchanged. A
    non-numeric value raises (the caller isolates it). Label sets go through ``labels`` (a
    fresh :class:`LabelWriter` when not given: its cache and count last this call only).
    """
    labels = LabelWriter() if labels is None else labels
    out: list[str] = []
    for fam in families:
        samples = fam.samples
        if any(s.timestamp is not None or s.exemplar is not None
               or (s.name != fam.name and s.name.endswith(_DEFERRED)) for s in samples):
            if openmetrics:
                text = om_exposition.generate_latest(_Families([fam])).decode("utf-8")
                out.append(text.removesuffix(_OM_EOF))
            else:
                out.append(exposition.generate_latest(_Families([fam])).decode("utf-8"))
            continue
        typ = fam.type
        doc = fam.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        if openmetrics:
            doc = doc.replace('"', '\\"')
            out.append(f"# HELP {fam.name} {doc}\n# TYPE {fam.name} {typ}\n")
            if fam.unit:
                out.append(f"# UNIT {fam.name} {fam.unit}\n")
        else:
            name = fam.name + ("_total" if typ == "counter" else "_info" if typ == "info" else "")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {_TYPE_NAMES.get(typ, typ)}\n")
        for s in samples:
            if s.labels:
                inner = labels.text(tuple(s.labels.items()))
                out.append(f"{s.name}{{{inner}}} {_value(s.value)}\n")
            else:
                out.append(f"{s.name} {_value(s.value)}\n")
    return "".join(out).encode("utf-8")


#: The line that ends an OpenMetrics exposition.
EOF = _OM_EOF.encode()


def wanted(families: Iterable[Metric], names: frozenset[str] | None) -> Iterable[Metric]:
    """The families with a sample named in ``names`` (a scrape's ``name[]``), or all of them
    when ``names`` is None (prometheus_client's ``restricted_registry`` does the same)."""
    if names is None:
        return families
    return (f for f in families if f.name in names or any(s.name in names for s in f.samples))


class _Families:
    """Adapter: a fixed list of families as something ``generate_latest`` can read."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class Exposition:
    """Builds the whole /metrics text from the collectors and the exporter's own health.

    ``collectors`` maps names to started collectors; ``backend`` is the GPU backend name for
    ``verlmon_node_info``; ``extra`` the parts that report on themselves (the exporter sets it
    to the live monitor's ``HealthRegistry.collect``: store, Slack, wandb, server, logs).
    """

    def __init__(
        self,
        collectors: dict[str, BaseCollector],
        node: str,
        version: str,
        backend: str = "none",
    ) -> None:
        self.collectors = collectors
        self.node = node
        self.version = version
        self.backend = backend
        #: more health families from the exporter itself (thread restarts, drop counters)
        self.extra: Callable[[], Iterable[Metric]] | None = None
        self.scrape_errors: dict[str, int] = {name: 0 for name in collectors}
        self._success: dict[str, bool] = {}
        self._duration: dict[str, float] = {}
        self._logged: dict[str, str] = {}
        self._lock = threading.Lock()  # one scrape at a time: collectors need not be reentrant
        #: this exporter's label text cache and shortened-value count (its own, not shared)
        self.labels = LabelWriter()

    def _run(self, name: str, collector: BaseCollector, names: frozenset[str] | None,
             openmetrics: bool) -> bytes:
        start = time.perf_counter()
        try:
            text = format_families(wanted(collector.collect(), names), openmetrics, self.labels)
            ok = collector.healthy()
        except Exception as exc:  # noqa: BLE001 - one broken collector never kills a scrape
            text = b""
            ok = False
            self.scrape_errors[name] = self.scrape_errors.get(name, 0) + 1
            message = f"{exc.__class__.__name__}: {exc}"
            if self._logged.get(name) != message:
                log.warning("collector %s: collect failed: %s", name, message)
                self._logged[name] = message
        self._duration[name] = time.perf_counter() - start
        self._success[name] = ok
        return text

    def render(self, names: frozenset[str] | None = None, openmetrics: bool = False) -> bytes:
        """The full exposition: text format 0.0.4, or OpenMetrics; only the families with a
        sample in ``names`` when given (a scrape's ``name[]``)."""
        with self._lock:
            parts = [self._run(name, c, names, openmetrics)
                     for name, c in self.collectors.items()]
            parts.append(format_families(wanted(self.health_families(), names), openmetrics,
                                         self.labels))
        if openmetrics:
            parts.append(EOF)
        return b"".join(parts)

    def collect(self) -> Iterable[Metric]:
        """Every family, for a ``CollectorRegistry`` (tests use ``get_sample_value``)."""
        with self._lock:
            for name, collector in self.collectors.items():
                start = time.perf_counter()
                try:
                    families = list(collector.collect())
                    ok = collector.healthy()
                except Exception:  # noqa: BLE001
                    families, ok = [], False
                    self.scrape_errors[name] = self.scrape_errors.get(name, 0) + 1
                self._duration[name] = time.perf_counter() - start
                self._success[name] = ok
                yield from families
            yield from self.health_families()

    def health_families(self) -> Iterable[Metric]:
        """Identity and collection-health families (from the last collect of each collector)."""
        build = GaugeMetricFamily(m.BUILD_INFO, "verl-monitor build; always 1.",
                                  labels=["version"])
        build.add_metric([self.version], 1)
        yield build
        node = GaugeMetricFamily(m.NODE_INFO, "This exporter's node name and GPU backend; "
                                 "always 1.", labels=["node", "backend"])
        node.add_metric([self.node, self.backend], 1)
        yield node
        success = GaugeMetricFamily(m.COLLECTOR_SUCCESS, "1 if the collector's last sampling "
                                    "and collection worked, else 0.", labels=["collector"])
        duration = GaugeMetricFamily(m.COLLECTOR_DURATION, "Seconds the collector's last "
                                     "collection took in the scrape.", labels=["collector"])
        errors = CounterMetricFamily(m.COLLECTOR_ERRORS.removesuffix("_total"),
                                     "Collector failures (sampling or collection), each logged.",
                                     labels=["collector"])
        for name, collector in self.collectors.items():
            if name in self._success:
                success.add_metric([name], 1.0 if self._success[name] else 0.0)
                duration.add_metric([name], self._duration[name])
            errors.add_metric([name], self.scrape_errors.get(name, 0)
                              + int(getattr(collector, "errors", 0) or 0))
        yield success
        yield duration
        yield errors
        yield CounterMetricFamily(m.LABELS_TRUNCATED.removesuffix("_total"),
                                  f"Samples with a label value over {MAX_LABEL_CHARS} "
                                  "characters, written shortened (start, ...#, digest); "
                                  "counted at every scrape.",
                                  value=float(self.labels.truncated))
        if self.extra is not None:
            yield from self.extra()
