"""The run store: one run's telemetry, steps, events and flags in a SQLite file (WAL mode).

- ``RunStore`` (``runstore.py``): open/create, write, read frames and records, ``compact()``.
- ``StoreWriter`` (``writer.py``): the exporter's bounded buffer that never raises.
- ``export_dir`` (``export.py``): dump to gpu.csv, host.csv, train.jsonl, events.json,
  flags.json for ``verl-monitor analyze``.
- retention rules: ``retention.py``; schema and its version: ``schema.py``.
"""

from monitor.store.interchange_export import export_dir
from monitor.store.runstore import OutboxItem, RunStore, StoreError
from monitor.store.schema import NCCL_COLUMNS, SCHEMA_VERSION
from monitor.store.writer import StoreWriter

__all__ = [
    "NCCL_COLUMNS",
    "SCHEMA_VERSION",
    "OutboxItem",
    "RunStore",
    "StoreError",
    "StoreWriter",
    "export_dir",
]
