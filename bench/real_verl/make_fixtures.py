"""Trim the device's ``real_verl.tar.gz`` runs into ``tests/fixtures/real_verl/<case>/``.

Kept per case: the console log verl-monitor run captured (``train.log``) and its capture-time
sidecar (``train.log.arrivals``); the store exported by ``verl-monitor export`` (``train.jsonl``,
``gpu.csv``, ``host.csv``, ``events.json``, the live exporter's flags as ``flags_live.json``,
``nccl.csv`` when it holds rows, its ``meta.json`` as ``store_meta.json``); the py-spy dumps
(``stacks/<unix_ts>_<role>_<pid>.txt``; the launcher, which only waits in ``ray.get``, thinned to
its first and last dump); and ``meta.json`` (case, verl commit, knobs, what was injected and
when, timings). The store itself, checkpoints and Ray's own files are left out.

    python3 bench/real_verl/make_fixtures.py RUNS_DIR [RUNS_DIR ...] --out tests/fixtures/real_verl
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

EXPORTED = {"train.jsonl": "train.jsonl", "gpu.csv": "gpu.csv", "host.csv": "host.csv",
            "events.json": "events.json", "flags.json": "flags_live.json",
            "meta.json": "store_meta.json", "nccl.csv": "nccl.csv"}


def trim_case(src: Path, dst: Path) -> int:
    """Copy one case's kept files; return the bytes written."""
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "stacks").mkdir(parents=True)
    for name in ("train.log", "train.log.arrivals", "meta.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    for name, as_name in EXPORTED.items():
        f = src / "export" / name
        if f.exists() and not (name == "nccl.csv" and len(f.read_text().splitlines()) < 2):
            shutil.copy(f, dst / as_name)
    launcher = sorted((src / "stacks").glob("*_Launcher_*.txt"))
    keep_launcher = {launcher[0], launcher[-1]} if launcher else set()
    for f in sorted((src / "stacks").glob("*.txt")):
        if "_Launcher_" in f.name and f not in keep_launcher:
            continue
        shutil.copy(f, dst / "stacks" / f.name)
    return sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="folders holding <case>/meta.json")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/real_verl"))
    args = ap.parse_args()
    total = 0
    for runs in args.runs:
        for src in sorted(p for p in runs.iterdir() if (p / "meta.json").exists()):
            size = trim_case(src, args.out / src.name)
            meta = json.loads((src / "meta.json").read_text())
            print(f"{src.name}: {size / 1024:.0f} KiB, rc={meta['rc']}, "
                  f"last step {meta['last_step']}, {meta['wall_s']} s")
            total += size
    print(f"total {total / 1024 / 1024:.2f} MiB")


if __name__ == "__main__":
    main()
