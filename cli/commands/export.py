"""``verl-monitor export STORE --out DIR``: dump a run store to files ``analyze`` reads back.

Writes gpu.csv, host.csv, train.jsonl, events.json, flags.json (plus nccl.csv and meta.json)
under DIR; then ``verl-monitor analyze DIR/train.jsonl --gpu DIR/gpu.csv --host DIR/host.csv``
reproduces the run's analysis. The store is read and the files written a chunk at a time, so
memory stays flat whatever the store's size. A missing or unreadable store (or one damaged
part-way) and a folder that cannot be written are one line and exit status 2.
"""

from __future__ import annotations

import argparse
import sqlite3

from cli.errors import CommandError, exits

PROG = "verl-monitor export"


#: How ``verl-monitor export`` is listed and described (``cli.main`` adds the parser).
PARSER: dict[str, str] = {
    "help": "export a run store (SQLite) to CSV/JSONL files that `analyze` reads",
    "description": ("Write the samples, steps, events and flags of a run store written by the "
        "exporter to DIR: gpu.csv and host.csv (interchange format), train.jsonl (one "
        "{step, ts, data} object per step, like verl's file logger), events.json, flags.json, "
        "nccl.csv and meta.json. Streams: memory stays flat whatever the store's size."),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``verl-monitor export``."""
    p.add_argument("store", metavar="STORE", help="run store file written by the exporter "
                   "(--store)")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="output folder (created if missing; files in it are overwritten)")


@exits("export")
def run(args: argparse.Namespace) -> int:
    """Run ``export``; 0 on success, 2 when the store or the output folder cannot be used."""
    from monitor.store import StoreError, export_dir

    try:
        counts = export_dir(args.store, args.out)
    except StoreError as exc:
        raise CommandError(str(exc)) from exc
    except OSError as exc:
        raise CommandError(f"{args.out}: cannot write ({exc.strerror or exc})") from exc
    except sqlite3.Error as exc:  # damage found part-way through the read
        raise CommandError(f"{args.store}: cannot read it all ({exc}); the files in "
                           f"{args.out} are incomplete") from exc
    summary = ", ".join(f"{v} {k}" for k, v in counts.items())
    print(f"exported {summary} to {args.out}")
    return 0
