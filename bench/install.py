"""Installed size and package count of each install role.

For each role (core, each extra, ``all``) this creates a fresh virtual environment in a
temporary directory, ``pip install``s a copy of this checkout (its tracked and untracked,
not ignored files: the build leaves nothing in the working tree) with that extra (not
editable, so the package itself is counted too), then measures:

- packages: distributions installed besides pip itself (``importlib.metadata`` in the venv);
- size: bytes on disk under the venv's site-packages (pip's own files left out), in MB
  (10^6 bytes) as ``du`` would add them up.

It prints one table and, with ``--out``, writes the same table to a file. The reference figures
(the single install of every dependency before the roles existed: 639 MB, 63 packages, from
the issue) are printed beside it as ratios; the ``all`` role installs that same dependency
set, so it re-measures "before" in the same run.

    .venv/bin/python bench/install.py --out bench/results/install_2026-11-30_devbox.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: role -> the requirement spec after the package path ("" is the core install).
ROLES: dict[str, str] = {
    "core": "",
    "dashboard": "[dashboard]",
    "wandb": "[wandb]",
    "slack": "[slack]",
    "all": "[all]",
}

#: The install before roles: every dependency in one `pip install` (the issue's figures).
BEFORE_MB = 639.0
BEFORE_PACKAGES = 63

_MEASURE = r"""
import json, os, sys, importlib.metadata as md, sysconfig
site = sysconfig.get_paths()["purelib"]
skip = {"pip", "setuptools", "wheel"}
names = sorted({d.metadata["Name"].lower() for d in md.distributions()} - skip)
total = 0
for dirpath, _dirs, files in os.walk(site):
    rel = os.path.relpath(dirpath, site)
    top = rel.split(os.sep)[0].lower()
    if top == "pip" or top.startswith("pip-"):
        continue
    for f in files:
        try:
            total += os.lstat(os.path.join(dirpath, f)).st_size
        except OSError:
            pass
print(json.dumps({"packages": names, "bytes": total}))
"""


def source_copy(dest: Path) -> Path:
    """Copy the checkout's tracked and untracked (not ignored) files to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def measure_role(role: str, extra: str, workdir: Path, python: str, src: Path) -> dict:
    """Install ``src`` with ``extra`` into a fresh venv under ``workdir``; its figures."""
    venv = workdir / role
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    started = time.monotonic()
    proc = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         f"{src}{extra}"],
        capture_output=True, text=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"pip install {role} failed: {' '.join(tail)}")
    out = subprocess.run([py, "-c", _MEASURE], capture_output=True, text=True, check=True)
    figures = json.loads(out.stdout)
    return {"role": role, "packages": figures["packages"], "count": len(figures["packages"]),
            "mb": figures["bytes"] / 1e6, "install_s": seconds}


def table(rows: list[dict]) -> str:
    """The results as a fixed-width table, with each role's share of the old install."""
    lines = [
        f"{'role':<10} {'packages':>8} {'size MB':>9} {'vs before (size)':>17} "
        f"{'vs before (pkgs)':>17} {'pip s':>6}",
        f"{'before':<10} {BEFORE_PACKAGES:>8} {BEFORE_MB:>9.0f} {'1.00':>17} {'1.00':>17} "
        f"{'':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['role']:<10} {r['count']:>8} {r['mb']:>9.0f} {r['mb'] / BEFORE_MB:>17.2f} "
            f"{r['count'] / BEFORE_PACKAGES:>17.2f} {r['install_s']:>6.0f}")
    lines.append("")
    lines.append("before: the issue's figures for the single install of every dependency; "
                 "all: that same dependency set, installed today")
    core = next((r for r in rows if r["role"] == "core"), None)
    if core is not None:
        lines.append("")
        lines.append("core packages: " + " ".join(core["packages"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure the roles given (default: all of them), print the table, maybe write it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roles", nargs="*",
                        help=f"roles to measure, of {', '.join(ROLES)} (default: all)")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that creates the venvs (default: this one)")
    args = parser.parse_args(argv)
    unknown = [r for r in args.roles if r not in ROLES]
    if unknown:
        parser.error(f"unknown role {unknown[0]!r} (choose from {', '.join(ROLES)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="verlmon-install-") as tmp:
        src = source_copy(Path(tmp) / "src")
        for role in args.roles or list(ROLES):
            print(f"installing {role} ...", file=sys.stderr, flush=True)
            rows.append(measure_role(role, ROLES[role], Path(tmp), args.python, src))
    text = table(rows)
    header = (f"# bench/install.py: fresh venv per role, pip install of this checkout "
              f"(python {sys.version.split()[0]}); MB = 10^6 bytes under site-packages, "
              f"pip/setuptools/wheel left out\n")
    print(header + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(header + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
