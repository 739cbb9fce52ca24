"""Trim the device's ``real_verl.tar.gz`` runs into ``tests/fixtures/real_verl/<case>/``.

Kept per case: the console log verl-monitor run captured (``train.log``) and its capture-time
sidecar (``train.log.arrivals``); the store exported by ``verl-monitor export`` (``train.jsonl``,
``gpu.csv``, ``host.csv``, ``events.json``, the live exporter's flags as ``flags_live.json``,
``nccl.csv`` when it holds rows, its ``meta.json`` as ``store_meta.json``); the py-spy dumps
(``stacks/<unix_ts>_<role>_<pid>.txt``; the launcher, which only waits in ``ray.get``, thinned to
its first and last dump); the live exporter's own dumps of its first hang round
(``store.db.stacks/``, as ``stacks_live/``); and ``meta.json`` (case, verl commit, knobs, what
was injected and when, timings; ``--rename CASE=NAME`` keeps a second recording of a case beside
the first, and ``concurrent_with`` follows the renames). The store itself, checkpoints and Ray's
own files are left out.

    python3 bench/real_verl/make_fixtures.py RUNS_DIR [RUNS_DIR ...] --out tests/fixtures/real_verl \
        [--rename hang_reward=hang_reward_live ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

EXPORTED = {"train.jsonl": "train.jsonl", "gpu.csv": "gpu.csv", "host.csv": "host.csv",
            "events.json": "events.json", "flags.json": "flags_live.json",
            "meta.json": "store_meta.json", "nccl.csv": "nccl.csv"}


def _first_live_round(src: Path, dst: Path) -> None:
    """The exporter's own py-spy dumps of its first hang round (``<ts>_<role>_<pid>.txt``)."""
    live = sorted((src / "store.db.stacks").glob("*_*_*.txt"))
    if not live:
        return
    first = live[0].name.split("_", 1)[0]
    (dst / "stacks_live").mkdir()
    for f in live:
        if f.name.startswith(first + "_"):
            shutil.copy(f, dst / "stacks_live" / f.name)


def _write_meta(src: Path, dst: Path, renames: dict[str, str]) -> dict:
    meta = json.loads((src / "meta.json").read_text())
    meta["case"] = renames.get(meta["case"], meta["case"])
    if meta.get("concurrent_with"):
        meta["concurrent_with"] = [renames.get(c, c) for c in meta["concurrent_with"]]
        meta["side_by_side"] = (f"run side by side with {len(meta['concurrent_with'])} other "
                                "jobs on the one GPU (one Ray instance each)")
    (dst / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def trim_case(src: Path, dst: Path, renames: dict[str, str] | None = None) -> int:
    """Copy one case's kept files; return the bytes written."""
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "stacks").mkdir(parents=True)
    _write_meta(src, dst, renames or {})
    _first_live_round(src, dst)
    for name in ("train.log", "train.log.arrivals"):
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
    ap.add_argument("--rename", action="append", default=[], metavar="CASE=NAME",
                    help="record CASE as NAME (a second recording beside the first)")
    ap.add_argument("--only", action="append", default=[], metavar="CASE",
                    help="trim only these cases (default: every case found)")
    args = ap.parse_args()
    bad = [r for r in args.rename if r.count("=") != 1 or not all(r.split("="))]
    if bad:
        ap.error(f"--rename takes CASE=NAME, got {bad}")
    renames = dict(r.split("=") for r in args.rename)
    total = 0
    for runs in args.runs:
        for src in sorted(p for p in runs.iterdir() if (p / "meta.json").exists()):
            if args.only and src.name not in args.only:
                continue
            size = trim_case(src, args.out / renames.get(src.name, src.name), renames)
            meta = json.loads((src / "meta.json").read_text())
            print(f"{src.name}: {size / 1024:.0f} KiB, rc={meta['rc']}, "
                  f"last step {meta['last_step']}, {meta['wall_s']} s")
            total += size
    print(f"total {total / 1024 / 1024:.2f} MiB")


if __name__ == "__main__":
    main()
