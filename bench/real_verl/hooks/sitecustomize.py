"""Loaded by every Python process of the mem_grow case (this folder is put on PYTHONPATH).

In verl's worker process (the Ray ``WorkerDict`` actor), once ``verl.workers.fsdp_workers`` is
imported, ``ActorRolloutRefWorker.update_actor`` is wrapped: from update ``VERL_REAL_FAULT_STEP``
on, each call allocates ``VERL_REAL_GROW_GIB`` GiB on the GPU and keeps it (a leak: tensors held
in a list that nothing clears). The first time is written to ``$VERL_REAL_MARKERS/mem_grow.json``.
"""

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

_TARGET = "verl.workers.fsdp_workers"
_kept = []
_calls = [0]


def _patch(module):
    cls = getattr(module, "ActorRolloutRefWorker", None)
    if cls is None or getattr(cls.update_actor, "_verl_real_grow", False):
        return
    original = cls.update_actor

    @functools.wraps(original)
    def update_actor(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        _calls[0] += 1
        if _calls[0] >= int(os.environ.get("VERL_REAL_FAULT_STEP", "3")):
            import torch

            gib = float(os.environ.get("VERL_REAL_GROW_GIB", "4"))
            _kept.append(torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda"))
            _kept[-1].fill_(1)
            _mark(_calls[0], len(_kept) * gib)
        return out

    update_actor._verl_real_grow = True
    cls.update_actor = update_actor


def _mark(step, kept_gib):
    folder = os.environ.get("VERL_REAL_MARKERS", "/tmp/verl_real/markers")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "mem_grow.json")
    first = {}
    if os.path.exists(path):
        with open(path) as f:
            first = json.load(f)
    rec = {"event": "mem_grow", "ts": first.get("ts", time.time()),
           "step": first.get("step", step), "pid": os.getpid(),
           "last_step": step, "kept_gib": kept_gib, "last_ts": time.time()}
    with open(path, "w") as f:
        json.dump(rec, f)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get("VERL_REAL_FAULT") == "mem_grow":
    sys.meta_path.insert(0, _Finder())
