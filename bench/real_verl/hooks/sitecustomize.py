"""Loaded by every Python process of a case with ``hooks=True`` (this folder is on PYTHONPATH).

Both hooks act in verl's worker process (the Ray ``WorkerDict`` actor), once
``verl.workers.fsdp_workers`` is imported, and only when their variable is set:

- ``VERL_REAL_FAULT=mem_grow`` (a fault): ``ActorRolloutRefWorker.update_actor`` is wrapped: from
  update ``VERL_REAL_FAULT_STEP`` on, each call allocates ``VERL_REAL_GROW_GIB`` GiB on the GPU
  and keeps it (a leak: tensors held in a list that nothing clears). The first time is written to
  ``$VERL_REAL_MARKERS/mem_grow.json``.
- ``VERL_REAL_CRITIC_ATTN=sdpa`` (a switch of this harness, not a verl knob): verl 4c3310db
  asks for ``attn_implementation="flash_attention_2"`` when it builds the critic
  (``CriticWorker._build_critic_model_optimizer``: ``AutoConfig.from_pretrained`` there and
  ``AutoModelForTokenClassification.from_pretrained`` in ``verl.utils.model.
  load_valuehead_model``), and flash-attn cannot be had on the GPU image; it never applies
  ``critic.model.override_config`` to the critic's config either, so no Hydra key reaches it.
  While that method runs, those two calls get the variable's value instead of
  ``flash_attention_2`` (the actor's and ref's are switched by verl's own
  ``actor_rollout_ref.model.override_config._attn_implementation``). Each switch is written to
  ``$VERL_REAL_MARKERS/critic_attn.json``.
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
_in_critic = [False]


def _patch(module):
    if os.environ.get("VERL_REAL_FAULT") == "mem_grow":
        _patch_grow(module)
    if os.environ.get("VERL_REAL_CRITIC_ATTN"):
        _patch_critic_attn(module)


def _wrap(module, cls_name, name, make):
    """Replace ``module.<cls_name>.<name>`` by ``make(original)``, once; False if not there."""
    cls = getattr(module, cls_name, None)
    if cls is None or getattr(getattr(cls, name), "_verl_real", False):
        return False
    original = getattr(cls, name)
    wrapped = functools.wraps(original)(make(original))
    wrapped._verl_real = True
    setattr(cls, name, wrapped)
    return True


def _patch_grow(module):
    def make(original):
        def update_actor(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            _calls[0] += 1
            if _calls[0] >= int(os.environ.get("VERL_REAL_FAULT_STEP", "3")):
                import torch

                gib = float(os.environ.get("VERL_REAL_GROW_GIB", "4"))
                _kept.append(torch.empty(int(gib * (1 << 30)), dtype=torch.uint8,
                                         device="cuda"))
                _kept[-1].fill_(1)
                _mark(_calls[0], len(_kept) * gib)
            return out
        return update_actor

    _wrap(module, "ActorRolloutRefWorker", "update_actor", make)


def _patch_critic_attn(module):
    """While the critic is built, its flash_attention_2 requests become $VERL_REAL_CRITIC_ATTN."""
    def make(original):
        def build(self, *args, **kwargs):
            _in_critic[0] = True
            try:
                return original(self, *args, **kwargs)
            finally:
                _in_critic[0] = False
        return build

    if _wrap(module, "CriticWorker", "_build_critic_model_optimizer", make):
        import transformers

        for name in ("AutoConfig", "AutoModelForTokenClassification"):
            _switch_attn(getattr(transformers, name))


def _switch_attn(auto_cls):
    """Wrap ``auto_cls.from_pretrained`` (a classmethod) to swap the attention it is asked for."""
    func = auto_cls.from_pretrained.__func__

    @functools.wraps(func)
    def from_pretrained(cls, *args, **kwargs):
        asked = kwargs.get("attn_implementation")
        if _in_critic[0] and asked == "flash_attention_2":
            kwargs["attn_implementation"] = os.environ["VERL_REAL_CRITIC_ATTN"]
            _mark_attn(auto_cls.__name__, asked, kwargs["attn_implementation"])
        return func(cls, *args, **kwargs)

    auto_cls.from_pretrained = classmethod(from_pretrained)


def _mark_attn(where, asked, given):
    folder = os.environ.get("VERL_REAL_MARKERS", "/tmp/verl_real/markers")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "critic_attn.json")
    rec = {"switches": []}
    if os.path.exists(path):
        with open(path) as f:
            rec = json.load(f)
    rec.setdefault("ts", time.time())
    rec.update(event="critic_attn", step=None, pid=os.getpid(),
               what="harness switch, not a verl knob")
    rec["switches"].append({"call": f"{where}.from_pretrained", "asked": asked,
                            "given": given, "ts": time.time()})
    with open(path, "w") as f:
        json.dump(rec, f)


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


if os.environ.get("VERL_REAL_FAULT") == "mem_grow" or os.environ.get("VERL_REAL_CRITIC_ATTN"):
    sys.meta_path.insert(0, _Finder())
