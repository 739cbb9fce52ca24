"""A verl dataset whose loading blocks (``data.custom_cls.path/name`` of verl 0.5).

``BlockingRLHFDataset`` is verl's own ``RLHFDataset``; on the training files, after
``VERL_REAL_BLOCK_AFTER`` items fetched in one process (a DataLoader worker, or the driver with
``data.dataloader_num_workers=0``), each further ``__getitem__`` blocks on a read that never
completes, like a loader stuck on a network filesystem. The moment it starts is written to
``$VERL_REAL_MARKERS/data_block.json``.
"""

from __future__ import annotations

import json
import os
import threading
import time

from verl.utils.dataset.rl_dataset import RLHFDataset


class BlockingRLHFDataset(RLHFDataset):
    """verl's RLHFDataset that stops delivering after a number of training items."""

    def __init__(self, data_files, tokenizer, config, processor=None):
        super().__init__(data_files=data_files, tokenizer=tokenizer, config=config,
                         processor=processor)
        files = data_files if isinstance(data_files, (list, tuple)) else [data_files]
        self._blocks = any("train" in os.path.basename(str(f)) for f in files)
        self._after = int(os.environ.get("VERL_REAL_BLOCK_AFTER", "96"))
        self._served = 0

    def __getitem__(self, item):
        if self._blocks:
            self._served += 1
            if self._served > self._after:
                _mark_block(self._served)
                _wait_for_shard()
        return super().__getitem__(item)


def _mark_block(served: int) -> None:
    folder = os.environ.get("VERL_REAL_MARKERS", "/tmp/verl_real/markers")
    path = os.path.join(folder, "data_block.json")
    if os.path.exists(path):
        return
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"event": "data_block", "ts": time.time(), "items_served": served,
                   "pid": os.getpid()}, f)


def _wait_for_shard() -> None:
    """The frame a stack should name: a read of the next shard that never returns."""
    threading.Event().wait()
