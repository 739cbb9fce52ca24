"""The GPU and host signature of a phase or a period: what kept the step busy, in one word.

A phase that takes too long can be slow for opposite reasons, and the levers differ: GPUs idle
while one CPU core is pegged (the work is on the host: a reward function, data loading), GPUs
waiting on PCIe copies (parameter offload), GPUs spinning in a collective, a decode that keeps
few SMs busy, a memory-bound kernel mix, or plainly busy GPUs. The classifier reads the
samples' means (NVML utilization, GPM SM / DRAM / tensor activity and PCIe bytes, the host's
busiest core) and names one of :data:`SIGNATURES`. Pure functions of data frames; the
thresholds are the ``signature`` section of ``monitor/defaults.yaml`` (docs/signatures.md).

Used by the detectors (``Context.signatures``, ``Context.signature_between``) for evidence and
advice, and open to the GPU-seconds ledger (``sample_signatures``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

#: Every signature, in the order the rules try them.
SIGNATURES: tuple[str, ...] = (
    "cpu_bound",        # SMs idle while the host's busiest core is pegged
    "collective_spin",  # utilization high, SMs near zero: kernels waiting in a collective
    "idle",             # SMs idle and the host quiet
    "pcie_bound",       # PCIe traffic high and SMs below the busy line (offload copies)
    "memory_bound",     # DRAM bandwidth high, above the tensor pipes' activity
    "busy",             # SMs busy
    "thin",             # few SMs and little DRAM traffic: a thin decode or tiny kernels
    "light",            # below the busy line with none of the marks above
)

#: Plain words for each signature (evidence text).
WORDS: dict[str, str] = {
    "cpu_bound": "CPU-bound: the GPUs idled while one CPU core was pegged",
    "collective_spin": "spinning in a collective: utilization high with few SMs active",
    "idle": "idle: the GPUs did no work and no CPU core was pegged",
    "pcie_bound": "PCIe-bound: heavy host-device copies while the SMs sat below the busy line",
    "memory_bound": "memory-bound: DRAM bandwidth high, the tensor pipes less busy",
    "busy": "busy: the SMs were well used",
    "thin": "thin: few SMs and little DRAM traffic (a thin decode or tiny kernels)",
    "light": "light: below the busy line, with no single bottleneck in the counters",
}


@dataclass(frozen=True)
class Thresholds:
    """The classifier's lines (``signature`` section of defaults.yaml; percentages 0-100)."""

    idle_sm_max: float = 10.0
    cpu_pegged_pct: float = 90.0
    spin_util_min: float = 80.0
    spin_sm_max: float = 20.0
    pcie_bps_min: float = 1.0e9
    dram_high: float = 50.0
    busy_sm_min: float = 55.0
    thin_sm_max: float = 45.0
    thin_dram_max: float = 30.0
    host_match_s: float = 2.0

    @classmethod
    def from_config(cls, section: Mapping[str, object] | None) -> Thresholds:
        """Thresholds from a config section (keys named as the fields; absent keys default)."""
        section = section or {}
        vals = {f.name: float(section[f.name]) for f in fields(cls)  # type: ignore[arg-type]
                if section.get(f.name) is not None}
        return cls(**vals)


def _arr(x: object, n: int) -> np.ndarray:
    if x is None:
        return np.full(n, np.nan)
    a = np.asarray(x, dtype=float)
    return np.full(n, float(a)) if a.ndim == 0 else a


def classify(
    util: Iterable[float] | np.ndarray,
    sm: Iterable[float] | np.ndarray | None,
    dram: Iterable[float] | np.ndarray | None = None,
    pcie_bps: Iterable[float] | np.ndarray | None = None,
    cpu_max: Iterable[float] | np.ndarray | None = None,
    tensor: Iterable[float] | np.ndarray | None = None,
    th: Thresholds | None = None,
) -> np.ndarray:
    """The signature of each row of means (arrays of one length; NaN or None where unknown).

    ``sm`` falls back to ``util`` where it is NaN (a GPU without GPM); without SM activity a
    collective spin cannot be told from busy work, and is not claimed. Rows whose utilization
    and SM activity are both unknown get ``""``.
    """
    th = th or Thresholds()
    u = np.asarray(util, dtype=float)
    n = len(u)
    s_raw = _arr(sm, n)
    has_sm = np.isfinite(s_raw)
    s = np.where(has_sm, s_raw, u)
    d = _arr(dram, n)
    p = _arr(pcie_bps, n)
    c = _arr(cpu_max, n)
    t = np.nan_to_num(_arr(tensor, n), nan=0.0)
    known = np.isfinite(s)
    with np.errstate(invalid="ignore"):
        low = s <= th.idle_sm_max
        pegged = c >= th.cpu_pegged_pct
        spin = has_sm & (u >= th.spin_util_min) & (s <= th.spin_sm_max)
        pcie = (p >= th.pcie_bps_min) & (s < th.busy_sm_min)
        mem = (d >= th.dram_high) & (d >= t)
        busy = s >= th.busy_sm_min
        thin = (s < th.thin_sm_max) & ~(d >= th.thin_dram_max)
    out = np.select(
        # PCIe traffic first: copies from pageable host memory peg a CPU core too (the
        # driver stages them), and a pegged core over a busy PCIe link is offload, not a CPU
        # phase (1 H200, 4 GiB each way per log-prob pass: PCIe 2.3-2.5 GB/s, SM 9-12%,
        # busiest core 100%)
        [~known, pcie & low, low & pegged, spin, low, pcie, mem, busy, thin],
        ["", "pcie_bound", "cpu_bound", "collective_spin", "idle", "pcie_bound",
         "memory_bound", "busy", "thin"],
        default="light",
    )
    return out.astype(object)


def pcie_total(df: pd.DataFrame) -> pd.Series:
    """PCIe bytes per second both ways (NaN where neither direction is known)."""
    tx = df["pcie_tx_bps"] if "pcie_tx_bps" in df.columns else pd.Series(np.nan, index=df.index)
    rx = df["pcie_rx_bps"] if "pcie_rx_bps" in df.columns else pd.Series(np.nan, index=df.index)
    both = tx.astype(float).fillna(0.0) + rx.astype(float).fillna(0.0)
    return both.where(tx.notna() | rx.notna())


def with_host_cpu(gpu: pd.DataFrame, host: pd.DataFrame | None, match_s: float = 2.0
                  ) -> pd.DataFrame:
    """GPU samples with ``cpu_max``: the busiest core of the same node at the nearest host
    sample within ``match_s`` seconds (NaN without one)."""
    out = gpu.copy()
    out["cpu_max"] = np.nan
    if host is None or len(host) == 0 or len(out) == 0 or "cpu_max_core_pct" not in host:
        return out
    out["_order"] = np.arange(len(out))
    left = out.drop(columns="cpu_max").assign(
        node=out["node"].astype(str), ts=out["ts"].astype(float)).sort_values("ts")
    right = pd.DataFrame({"ts": host["ts"].astype(float), "node": host["node"].astype(str),
                          "cpu_max": host["cpu_max_core_pct"].astype(float)}).dropna(
        subset=["ts"]).sort_values("ts")
    merged = pd.merge_asof(left, right, on="ts", by="node", direction="nearest",
                           tolerance=float(match_s))
    merged = merged.sort_values("_order").drop(columns="_order")
    merged.index = gpu.index
    return merged


def sample_signatures(gpu: pd.DataFrame, host: pd.DataFrame | None = None,
                      th: Thresholds | None = None) -> pd.Series:
    """The signature of every GPU sample (aligned with ``gpu``), with its node's host CPU.

    Single samples are noisy; prefer :func:`summarize` over a phase or period where one fits.
    """
    th = th or Thresholds()
    if len(gpu) == 0:
        return pd.Series([], dtype=object, index=gpu.index)
    df = with_host_cpu(gpu, host, th.host_match_s)
    return pd.Series(_classify_frame(df, th), index=gpu.index, dtype=object)


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name].astype(float) if name in df.columns else pd.Series(np.nan, index=df.index)


def _classify_frame(df: pd.DataFrame, th: Thresholds) -> np.ndarray:
    pcie = df["pcie_bps"] if "pcie_bps" in df.columns else pcie_total(df)
    sm = df["sm"] if "sm" in df.columns else _col(df, "sm_active")
    return classify(_col(df, "util"), sm, _col(df, "dram_active"), pcie, _col(df, "cpu_max"),
                    _col(df, "tensor_active"), th)


#: Columns of :func:`summarize` besides the group keys.
SUMMARY_COLUMNS = ("n", "util", "sm", "dram_active", "tensor_active", "pcie_bps", "nvlink_bps",
                   "cpu_max", "signature")


def summarize(samples: pd.DataFrame, keys: list[str], th: Thresholds | None = None,
              host: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per group of ``keys`` (e.g. step, phase, node, gpu): the samples' means and signature.

    ``samples`` are GPU samples (``monitor.frames.GPU_COLUMNS``, labelled as the keys need);
    ``cpu_max`` is taken from the samples when present, else matched from ``host``.
    """
    th = th or Thresholds()
    if len(samples) == 0:
        return pd.DataFrame(columns=[*keys, *SUMMARY_COLUMNS])
    df = samples if "cpu_max" in samples.columns else with_host_cpu(samples, host,
                                                                   th.host_match_s)
    sm = _col(df, "sm_active")
    tmp = pd.DataFrame({k: df[k].to_numpy() for k in keys})
    tmp["util"] = _col(df, "util").to_numpy()
    tmp["sm"] = sm.where(sm.notna(), _col(df, "util")).to_numpy()
    tmp["dram_active"] = _col(df, "dram_active").to_numpy()
    tmp["tensor_active"] = _col(df, "tensor_active").to_numpy()
    tmp["pcie_bps"] = pcie_total(df).to_numpy()
    nv = _col(df, "nvlink_tx_bps").fillna(0.0) + _col(df, "nvlink_rx_bps").fillna(0.0)
    tmp["nvlink_bps"] = nv.where(_col(df, "nvlink_tx_bps").notna()
                                 | _col(df, "nvlink_rx_bps").notna()).to_numpy()
    tmp["cpu_max"] = _col(df, "cpu_max").to_numpy()
    tmp["sm_known"] = sm.notna().to_numpy()
    g = tmp.groupby(keys, sort=True, dropna=True)
    out = g[["util", "sm", "dram_active", "tensor_active", "pcie_bps", "nvlink_bps",
             "cpu_max"]].mean()
    out.insert(0, "n", g.size())
    # SM activity where the GPU reported it; without it the spin rule must not fire
    has_sm = g["sm_known"].any()
    out["signature"] = classify(out["util"], out["sm"].where(has_sm), out["dram_active"],
                                out["pcie_bps"], out["cpu_max"], out["tensor_active"], th)
    return out.reset_index()


@dataclass(frozen=True)
class Signature:
    """The dominant signature of a stretch of samples, and the means that gave it."""

    name: str
    phase: str | None
    share: float  # share of the stretch's GPU samples in groups of this signature
    util: float
    sm: float
    dram: float
    pcie_bps: float
    cpu_max: float
    n: int

    def evidence(self) -> str:
        """One sentence for a flag's evidence, with the numbers that support it."""
        parts = [f"SM {self.sm:.0f}%", f"util {self.util:.0f}%"]
        if np.isfinite(self.dram):
            parts.append(f"DRAM {self.dram:.0f}%")
        if np.isfinite(self.pcie_bps):
            parts.append(f"PCIe {self.pcie_bps / 1e9:.1f} GB/s")
        if np.isfinite(self.cpu_max):
            parts.append(f"busiest CPU core {self.cpu_max:.0f}%")
        where = f"{self.phase} was " if self.phase else "The GPUs were "
        return f"{where}{WORDS.get(self.name, self.name)} ({', '.join(parts)})."


def dominant(table: pd.DataFrame, prefer: tuple[str, ...] = ()) -> Signature | None:
    """The signature holding most samples in a :func:`summarize` table (one row per group).

    Signatures listed in ``prefer`` win when they hold at least a third of the samples (a
    bottleneck seen on part of the GPUs outweighs the busy rest). ``phase`` is the table's
    phase with most samples of that signature, when the table has a ``phase`` column.
    """
    if table is None or len(table) == 0:
        return None
    t = table[table["signature"].astype(str) != ""]
    if len(t) == 0:
        return None
    weight = t.groupby("signature")["n"].sum().sort_values(ascending=False, kind="stable")
    total = float(weight.sum())
    name = str(weight.index[0])
    for p in prefer:
        if p in weight.index and weight[p] >= total / 3:
            name = p
            break
    rows = t[t["signature"] == name]
    w = rows["n"].astype(float)

    def mean(col: str) -> float:
        v = rows[col].astype(float)
        ok = v.notna()
        return float((v[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else float("nan")

    phase = None
    if "phase" in rows.columns and rows["phase"].notna().any():
        phase = str(rows.groupby("phase")["n"].sum().idxmax())
    return Signature(name=name, phase=phase, share=float(w.sum()) / total, util=mean("util"),
                     sm=mean("sm"), dram=mean("dram_active"), pcie_bps=mean("pcie_bps"),
                     cpu_max=mean("cpu_max"), n=int(w.sum()))


def step_phase_signatures(labelled: pd.DataFrame, host: pd.DataFrame | None,
                          th: Thresholds | None = None) -> pd.DataFrame:
    """Per (step, phase, node, gpu) of GPU samples labelled with ``step`` and ``phase``: the
    means and the signature (see :func:`summarize`). Unlabelled samples are left out."""
    if len(labelled) == 0 or "phase" not in labelled.columns:
        return pd.DataFrame(columns=["step", "phase", "node", "gpu", *SUMMARY_COLUMNS])
    sub = labelled[labelled["phase"].notna() & labelled["step"].notna()]
    return summarize(sub, ["step", "phase", "node", "gpu"], th, host)
