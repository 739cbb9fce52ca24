"""Crash triage: the cause of a failure read from the exception the log printed.

A run that dies prints why: a Python exception (its type, its message, the frames above it) or
a failure line (``monitor.logs.failure_lines``). This module is the table of causes read from
the exception: for each, what in the exception's type, message or frames identifies it, the
premise its advice needs, and the advice, naming real verl config keys. ``diagnose`` reads one
printed exception (``Raised``, built from a ``traceback`` event) against the table, most
specific cause first; the ``fatal_error`` detector chooses the first printed exception that has
a cause, and gives the "a worker died" advice only where nothing printed one.

Names in the advice that come from the log (a config key the message quotes, a module, a
package) are quoted as the log wrote them, in single quotes; every other dotted name is a real
verl key (``monitor.detect.flag_advice.REAL_KEYS``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monitor.logs.exception_lines import ExceptionLine, exception_line

#: Frames of the machinery between the code and the failure (not where a cause lies).
_PLUMBING = ("ray/", "omegaconf/", "hydra/", "<frozen", "importlib/", "python/ray/")


def _is_verl(frame: str) -> bool:
    return frame.startswith("verl/")


@dataclass(frozen=True)
class Raised:
    """One exception as the log printed it: the chain (as printed, root cause first), the
    frames (deepest last), the deepest frame's source line, the message's detail lines
    (omegaconf's ``full_key: x``), the Ray task and its verl phase."""

    chain: tuple[ExceptionLine, ...]
    frames: tuple[str, ...] = ()
    code: str = ""
    detail: tuple[str, ...] = ()
    task: str | None = None
    phase: str | None = None
    verl_frame: str | None = None

    @property
    def own_frame(self) -> str | None:
        """The deepest frame of the code that called into the libraries: verl's, else the
        deepest frame outside the plumbing (Ray, omegaconf, Hydra, importlib)."""
        if self.verl_frame:
            return self.verl_frame
        for frame in reversed(self.frames):
            if not frame.startswith(_PLUMBING):
                return frame
        return self.frames[-1] if self.frames else None

    @property
    def last(self) -> ExceptionLine | None:
        """The exception the chain ends with (the one raised last), None for none."""
        return self.chain[-1] if self.chain else None

    @classmethod
    def from_event(cls, data: Mapping[str, Any]) -> Raised:
        """The exception a ``traceback`` event (``monitor.logs.blocks``) holds."""
        printed = list(data.get("exceptions") or [data.get("exception") or ""])
        chain = []
        for text in printed:
            found = exception_line(text) if text else None
            if found is None and text:
                found = ExceptionLine("", None, str(text).strip(), typed=False)
            if found is not None:
                chain.append(found)
        frames = tuple(data.get("frames") or ())
        verl = data.get("verl_frame") or (frames[-1] if frames and _is_verl(frames[-1])
                                          else None)
        return cls(tuple(chain), frames, str(data.get("code") or ""),
                   tuple(data.get("detail") or ()), data.get("task"), data.get("phase"), verl)


@dataclass(frozen=True)
class Hit:
    """A cause found: the cause, the exception of the chain that shows it, the values the
    match captured (the advice's placeholders) and the exception read."""

    cause: CrashCause
    exception: ExceptionLine
    values: dict[str, str]
    raised: Raised

    @property
    def advice(self) -> list[str]:
        """The cause's advice for this exception."""
        if self.cause.advise is not None:
            return self.cause.advise(self)
        return [s.format(**self.values) for s in self.cause.advice]


@dataclass(frozen=True)
class CrashCause:
    """One cause of a crash: how the printed exception shows it and what to do.

    ``types``: class names (without module) of which one must be in the chain (empty: any);
    ``message``: searched in that exception's message (and in the deepest frame's source line
    with ``in_code``: a quote cut before the message still shows the ``raise``); ``frames``:
    searched in the frames (the deepest only with ``deepest``); ``exclude``: a message that rules the cause out. ``root`` is False
    for a cause that follows another failure (a peer closed the connection because it died).
    ``advice`` are sentences with ``{name}`` placeholders from the match's named groups and
    ``extract``; ``advise`` builds them instead where they depend on more.
    """

    id: str
    identifies: str
    premise: str
    types: frozenset[str] = frozenset()
    message: re.Pattern[str] | None = None
    frames: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None
    in_code: bool = False
    deepest: bool = False
    root: bool = True
    advice: tuple[str, ...] = ()
    extract: Callable[[re.Match[str] | None, Raised], dict[str, str]] | None = None
    advise: Callable[[Hit], list[str]] | None = field(default=None, compare=False)

    def match(self, raised: Raised) -> Hit | None:
        """The hit of this cause on ``raised``, or None: the last printed exception that
        shows it (a Ray ``RayTaskError(X)`` wrapper only where no other does)."""
        if self.frames is not None:
            frames = raised.frames[-1:] if self.deepest else raised.frames
            if not any(self.frames.search(f) for f in frames):
                return None
        wrappers = [e for e in raised.chain if e.wrapped]
        for exc in [e for e in reversed(raised.chain) if not e.wrapped] + wrappers:
            if self.types and exc.name not in self.types:
                continue
            if self.exclude is not None and self.exclude.search(exc.message):
                continue
            found: re.Match[str] | None = None
            if self.message is not None:
                found = self.message.search(exc.message)
                if found is None and self.in_code and raised.code:
                    found = self.message.search(raised.code)
                if found is None:
                    continue
            values = {k: v for k, v in (found.groupdict() if found else {}).items() if v}
            if self.extract is not None:
                values.update(self.extract(found, raised))
            return Hit(self, exc, values, raised)
        return None


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def diagnose(raised: Raised, causes: tuple[CrashCause, ...] | None = None) -> Hit | None:
    """The most specific cause (the table's order) that the printed exception shows."""
    for cause in CAUSES if causes is None else causes:
        hit = cause.match(raised)
        if hit is not None:
            return hit
    return None


# --- what the advice quotes from the exception ------------------------------------------------

_SO_PATH_RE = re.compile(r"(?P<path>[^\s:'\"]+\.so)(?:\.[\d.]+)?: undefined symbol")
_PACKAGE_ROOTS = ("/site-packages/", "/dist-packages/")


def _package_of(path: str) -> str:
    """The package a file belongs to: the first folder under site-packages (the file's own
    name, up to its first dot, when it lies there directly)."""
    for root in _PACKAGE_ROOTS:
        at = path.rfind(root)
        if at >= 0:
            rest = path[at + len(root):]
            return rest.split("/", 1)[0].split(".", 1)[0] if "/" not in rest \
                else rest.split("/", 1)[0]
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2:
        return parts[-2]
    return parts[-1].split(".", 1)[0] if parts else path


def _library(found: re.Match[str] | None, raised: Raised) -> dict[str, str]:
    """``library``: the compiled extension's package, from the ``.so`` path of the message."""
    text = " ".join(e.message for e in raised.chain)
    so = _SO_PATH_RE.search(text)
    return {"library": _package_of(so.group("path")) if so else "the extension"}


def _top(found: re.Match[str] | None, raised: Raised) -> dict[str, str]:
    """``package``: the top-level package of the module the message names."""
    module = (found.groupdict().get("module") or "") if found else ""
    return {"package": module.split(".", 1)[0] or "the package"}


def _where(raised: Raised) -> str:
    own = raised.own_frame
    return f" ({own})" if own else ""


def _full_key(found: re.Match[str] | None, raised: Raised) -> dict[str, str]:
    """``full_key``: the dotted key omegaconf names (its ``full_key:`` detail, or the key)."""
    text = " ".join([*raised.detail, *(e.message for e in raised.chain)])
    match = re.search(r"full_key:\s*([\w.]+)", text)
    key = (found.groupdict().get("key") or "") if found else ""
    where = ""
    if raised.frames:
        deepest = raised.frames[-1]
        if deepest.startswith("omegaconf/"):  # the read is in these frames: its caller's
            where = _where(raised)
        elif not deepest.startswith(_PLUMBING):
            where = f" ({deepest})"
    return {"full_key": match.group(1) if match else key, "where": where}


def _frame_where(found: re.Match[str] | None, raised: Raised) -> dict[str, str]:
    """``where``: the deepest frame; ``code``: its source line ('' when not printed)."""
    return {"where": raised.frames[-1] if raised.frames else "its frame",
            "code": f" (`{raised.code}`)" if raised.code else ""}


def _caller(found: re.Match[str] | None, raised: Raised) -> dict[str, str]:
    """``caller``: the deepest frame of the code that called the library (verl's own)."""
    own = raised.own_frame
    return {"caller": f"at {own}" if own else "in the quoted frames"}


# --- advice that depends on more than the message ---------------------------------------------

def _cuda_oom(hit: Hit) -> list[str]:
    from monitor.detect.flag_advice import oom_advice
    from monitor.logs.failure_lines import function_phase, traceback_phase

    phase = hit.raised.phase
    if phase is None:
        named = traceback_phase([f"File \"x\", line 1, in {f.rsplit(' in ', 1)[-1]}"
                                 for f in hit.raised.frames])
        phase = named[1] if named else None
    if phase is None and hit.raised.task:
        phase = function_phase(hit.raised.task.rsplit(".", 1)[-1])
    return oom_advice(phase)


_CHECKPOINT_SAVE_RE = re.compile(r"save_checkpoint")


def _host_oom(hit: Hit) -> list[str]:
    from monitor.detect.flag_advice import FAILURE_ADVICE

    out = list(FAILURE_ADVICE["worker_killed:host_oom"])
    if any(_CHECKPOINT_SAVE_RE.search(f) for f in hit.raised.frames):
        out.insert(0, CHECKPOINT_HOST_OOM)
    return out


#: Host memory ran out while a checkpoint was saved (the frames name save_checkpoint).
CHECKPOINT_HOST_OOM = (
    "The host ran out of memory while saving a checkpoint: each worker gathers its part in host "
    "memory, all at once. Save less (actor_rollout_ref.actor.checkpoint.save_contents without "
    "'optimizer'; actor_rollout_ref.actor.checkpoint.contents before verl 0.4.1) or less often "
    "(trainer.save_freq), or give the node more host memory."
)


def _raised_device(hit: Hit) -> list[str]:
    from monitor.detect.flag_advice import EXCEPTION_ADVICE

    for pattern, phases, sentences in EXCEPTION_ADVICE:
        if re.search(pattern, hit.exception.message) and (
                phases is None or hit.raised.phase in phases):
            return list(sentences)
    return []


# --- the table --------------------------------------------------------------------------------

#: No reward function for the rows' data_source (the message's, or the raise in the frames).
_REWARD_ADVICE = (
    "verl's default reward (default_compute_score) picks the scoring function by each row's "
    "data_source, and has none for the rows of this batch{source_said}: give the rows a "
    "data_source verl scores (verl's examples/data_preprocess scripts set it) or point your "
    "own scorer at it: custom_reward_function.path and custom_reward_function.name "
    "(reward.custom_reward_function.path and reward.custom_reward_function.name from verl "
    "0.7.1 on)."
)

CAUSES: tuple[CrashCause, ...] = (
    CrashCause(
        "cuda_oom", "torch's OutOfMemoryError or CUDA's 'out of memory' (not Ray's host-memory "
        "kill)", "the GPU's memory ran out (the message is torch's or CUDA's)",
        types=frozenset({"OutOfMemoryError"}), exclude=_re(r"running low on memory"),
        advise=_cuda_oom),
    CrashCause(
        "host_oom", "Ray's memory monitor or the kernel killed a worker for host memory",
        "the node's host memory ran out (Ray's or the kernel's message says so)",
        message=_re(r"running low on memory|killed due to memory pressure|"
                    r"Out of memory: Killed process"), advise=_host_oom),
    CrashCause(
        "dataloader_killed", "a DataLoader worker process killed by a signal",
        "the signal is the one the message names (Killed: SIGKILL)",
        message=re.compile(r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: "
                           r"(?P<signal>[\w ]+)"),
        advise=lambda hit: _dataloader_killed(hit)),
    CrashCause(
        "offload_device_mismatch", "a parameter on the CPU when its pass ran",
        "the message says a tensor was on the CPU where the compute device was expected",
        message=_re(r"Expects tensor to be on the compute device|Expected all tensors to be on "
                    r"the same device|was on cpu"), advise=_raised_device),
    CrashCause(
        "torch_abi_mismatch", "a compiled extension (.so) missing a symbol of torch's "
        "(c10, at, torch namespaces) at import",
        "the missing symbol is torch's own (c10/at/torch), so the extension was built for "
        "another torch",
        message=re.compile(r"\.so(?:\.[\d.]+)?: undefined symbol: (?P<symbol>_ZN\w*?"
                           r"(?:3c10|2at|5torch)\w*)"),
        extract=_library,
        advice=("The compiled extension '{library}' does not load: it needs '{symbol}', a "
                "symbol of torch's own, that the installed torch does not have. It was built "
                "for another torch: reinstall '{library}' built for the installed torch (a "
                "wheel for that torch version, or a rebuild from source against it), or "
                "install the torch version it was built for.",)),
    CrashCause(
        "torch_ops_missing", "torch.ops has no op a compiled extension should register",
        "the op's namespace exists but the op does not: the extension that registers it did "
        "not load into this torch",
        message=re.compile(r"'_OpNamespace' '(?P<namespace>\w+)' object has no attribute "
                           r"'(?P<op>\w+)'"),
        advice=("torch's '{namespace}' op namespace has no '{op}': the compiled library that "
                "registers that op (vLLM's kernels register under '_C') did not load into this "
                "torch, "
                "mostly because it was built for another torch version. Install the torch "
                "version that library pins (its requirements), or a build of the library for "
                "the installed torch.",)),
    CrashCause(
        "native_symbol_missing", "a compiled extension (.so) missing a symbol at import",
        "a compiled extension does not load against the installed libraries",
        message=re.compile(r"\.so(?:\.[\d.]+)?: undefined symbol: (?P<symbol>\S+)"),
        extract=_library,
        advice=("The compiled extension '{library}' does not load: it needs '{symbol}', which "
                "the installed libraries do not have: it was built against other versions of "
                "them (torch, CUDA, the C++ runtime). Reinstall '{library}' built for the "
                "installed versions.",)),
    CrashCause(
        "missing_module", "ModuleNotFoundError: No module named 'x'",
        "the module is not importable in the process that raised it",
        types=frozenset({"ModuleNotFoundError", "ImportError"}),
        message=re.compile(r"No module named '(?P<module>[\w.]+)'"), extract=_top,
        advise=lambda hit: _missing_module(hit)),
    CrashCause(
        "import_name_missing", "ImportError: cannot import name 'X' from 'Y'",
        "the module is there but lacks the name: another version of its package than the "
        "importing code was written for",
        types=frozenset({"ImportError"}),
        message=re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'"),
        extract=_top,
        advice=("The installed '{package}' has no '{name}' in '{module}': the code importing it "
                "was written for another '{package}' version. Install the '{package}' version "
                "that code pins (verl's install requirements and its install guide name the "
                "vLLM and SGLang versions each verl release is tested with), or the code's "
                "version that "
                "matches the installed '{package}'.",)),
    CrashCause(
        "datasets_feature_type", "datasets' \"Feature type 'X' not found\"",
        "the data file names a feature type the installed datasets does not know",
        message=re.compile(r"Feature type '(?P<feature>\w+)' not found"),
        advice=("The data file was written by another version of the 'datasets' library than "
                "the one reading it: the installed datasets has no feature type '{feature}' "
                "(datasets 4 writes 'List' where older versions wrote 'Sequence'). Use the same "
                "datasets version where the parquet is made and where verl reads it (or "
                "rewrite the file), and clear the Hugging Face datasets cache after switching.",
                )),
    CrashCause(
        "config_key_missing", "omegaconf: the code reads a key the config does not define",
        "the config the job loaded lacks a key the code reads",
        message=re.compile(r"Key '(?P<key>[^']+)' (?:is )?not in (?:struct|'(?P<owner>\w+)')|"
                           r"Missing key (?P<missing>[\w.]+)"),
        extract=_full_key,
        advise=lambda hit: _config_key(hit)),
    CrashCause(
        "config_override_rejected", "Hydra: could not override a key the config does not have",
        "the command line overrides a key this verl's config does not define",
        message=re.compile(r"Could not override '(?P<key>[\w.]+)'"),
        advice=("The command line overrides '{key}', which this verl's config does not have, "
                "so Hydra refuses it: it is from another verl version, or misspelt. Remove the "
                "override (or check the key in the installed verl's trainer config); a '+' "
                "prefix would only add a key that verl does not read.",)),
    CrashCause(
        "reward_not_implemented", "verl's default scorer has no reward function for the "
        "rows' data_source", "the rows name a data_source verl's default_compute_score does "
        "not score, and no custom reward function is set",
        message=re.compile(r"Reward function is not implemented for (?P<source>data_source=\S*)"
                           r"|Reward function is not implemented"), in_code=True,
        advice=(_REWARD_ADVICE,),
        extract=lambda found, raised: {"source_said": _source_said(found)}),
    CrashCause(
        "reward_not_implemented_frame", "NotImplementedError raised in verl's default scorer",
        "the scorer verl picks by data_source raised NotImplementedError: it has no function "
        "for the rows' data_source",
        types=frozenset({"NotImplementedError"}),
        frames=re.compile(r"reward_score/__init__\.py:\d+ in \w*compute_score"),
        advice=(_REWARD_ADVICE,), extract=lambda found, raised: {"source_said": ""}),
    CrashCause(
        "prompt_too_long", "a prompt longer than the limit the message names (the rollout "
        "engine's max model length, or verl's max_length at tokenization)",
        "the length the message names exceeds the limit it names",
        message=re.compile(
            r"Prompt length of (?P<length>\d+) is longer than the maximum model length of "
            r"(?P<limit>\d+)|Input prompt \((?P<length2>\d+) tokens\) is too long and exceeds "
            r"limit of (?P<limit2>\d+)|sequence_length=(?P<length3>\d+) is larger than "
            r"max_length=(?P<limit3>\d+)"),
        extract=lambda found, raised: _lengths(found),
        advice=("A prompt of {length} tokens is longer than the limit of {limit}: drop the "
                "long prompts when the dataset loads (data.filter_overlong_prompts=True, with "
                "data.filter_overlong_prompts_workers to speed it up), cut them "
                "(data.truncation='left' or 'right'), or raise data.max_prompt_length (the "
                "rollout's max model length is data.max_prompt_length plus "
                "data.max_response_length).",)),
    CrashCause(
        "batch_length_mismatch", "concatenating a batch's samples fails on one sequence "
        "longer than the others", "the samples of one batch are padded to one length; one is "
        "longer than that length",
        message=re.compile(r"Sizes of tensors must match except in dimension 0\. Expected "
                           r"size (?P<width>\d+) but got size (?P<longer>\d+)"),
        frames=re.compile(r"\bin _?cat\b|torch_func"),
        advice=("Concatenating the batch's samples failed: one is {longer} tokens wide where "
                "the batch is padded to {width}. verl pads each sample to data.max_prompt_length "
                "plus data.max_response_length, so a prompt longer than data.max_prompt_length "
                "got through: drop long prompts as the dataset loads "
                "(data.filter_overlong_prompts=True) or raise data.max_prompt_length.",)),
    CrashCause(
        "batch_not_divisible", "verl's DataProto.chunk: a batch that does not split evenly",
        "the batch size and the number of chunks the message names do not divide",
        message=re.compile(r"only support equal chunk\. Got size of DataProto (?P<size>\d+) "
                           r"and chunk (?P<chunks>\d+)"),
        advice=("verl splits each batch into equal chunks, one per data-parallel worker group "
                "(data parallel x pipeline x context parallel ranks): a batch of {size} does "
                "not split into {chunks}. Make data.train_batch_size (times "
                "actor_rollout_ref.rollout.n where the batch holds every sample) a multiple of "
                "{chunks}, or run on fewer ranks.",)),
    CrashCause(
        "mini_batch_zero", "verl's check that ppo_mini_batch_size stays above 0 once divided "
        "per rank", "verl divides the mini-batch by the data-parallel size",
        message=re.compile(r"ppo_mini_batch_size (?P<value>-?\d+) should be larger than 0"),
        advice=("verl divides actor_rollout_ref.actor.ppo_mini_batch_size (times "
                "actor_rollout_ref.rollout.n) by the number of data-parallel ranks, and that "
                "came to {value}: raise actor_rollout_ref.actor.ppo_mini_batch_size to at least "
                "the number of GPUs divided by actor_rollout_ref.rollout.n, or run on fewer "
                "GPUs (trainer.n_gpus_per_node, trainer.nnodes).",)),
    CrashCause(
        "weight_bucket_too_small", "verl's weight-sync bucket smaller than one weight",
        "the weight the message names is larger than the bucket",
        message=re.compile(r"Weight (?P<weight>[\w.]+)\(.*\) is too large to fit in the "
                           r"bucket"),
        advice=("The weight sync packs weights into buckets, and '{weight}' alone is larger "
                "than one: raise actor_rollout_ref.rollout.checkpoint_engine."
                "update_weights_bucket_megabytes (actor_rollout_ref.rollout."
                "update_weights_bucket_megabytes in verl 0.5 to 0.7) above that weight's size; "
                "each bucket is held twice on the device while it is sent.",)),
    CrashCause(
        "ray_gpus_unavailable", "verl's check that Ray has the GPUs the job asks for",
        "Ray reports fewer free GPUs than the job's resource pools ask for",
        message=re.compile(r"Total available GPUs (?P<free>\d+) is less than total desired "
                           r"GPUs (?P<wanted>\d+)"),
        advice=("Ray has {free} GPUs free of the {wanted} the job asks for "
                "(trainer.n_gpus_per_node x trainer.nnodes): another Ray job, or an earlier "
                "run's actors, still holds them, or Ray was started without them. Run `ray "
                "status` to see who holds the cluster's GPUs; stop the other job (ray stop on a "
                "cluster you own) or ask for fewer.",)),
    CrashCause(
        "checkpoint_file_missing", "a checkpoint folder without a file the loader reads",
        "the missing file lies in a checkpoint folder (global_step_N)",
        message=re.compile(r"(?P<folder>[^\s']*global_step_\d+)/(?P<file>[^\s']+?)"
                           r"(?:'| does not exist|$)"),
        advise=lambda hit: _checkpoint_file(hit)),
    CrashCause(
        "install_file_missing", "a file of an installed package is not there",
        "the missing file lies inside site-packages: the install is incomplete",
        types=frozenset({"FileNotFoundError"}),
        message=re.compile(r"(?P<path>/\S*(?:site|dist)-packages/(?P<package>[\w-]+)/\S*?)"
                           r"'?$"),
        advice=("The installed '{package}' lacks a file it reads ({path}): the install is "
                "incomplete or broken. Reinstall it (pip install -U, or an editable install "
                "from a checkout of a release that ships the file).",)),
    CrashCause(
        "data_file_missing", "the dataset file the job names is not there",
        "the missing file is a data file (parquet, json, jsonl, arrow, csv)",
        types=frozenset({"FileNotFoundError"}),
        message=re.compile(r"(?P<path>[^\s']+\.(?:parquet|jsonl?|arrow|csv))"),
        advice=("The data file {path} is not there: data.train_files and data.val_files name "
                "files to read, not to make. Prepare the data first (verl's "
                "examples/data_preprocess scripts write the example parquet files) or point "
                "those keys at where the files are.",)),
    CrashCause(
        "chat_template", "the tokenizer's chat template raised (jinja2 TemplateError)",
        "the template refused the messages it was given",
        types=frozenset({"TemplateError", "TemplateSyntaxError"}),
        message=re.compile(r"(?P<said>.+)"),
        advice=("The tokenizer's chat template refused the messages ('{said}'): the messages "
                "the dataset (or verl's multi-turn code) hands to apply_chat_template do not fit "
                "what this model's template accepts (its roles, their order, a user turn). "
                "Check the dataset's messages against the template, or pass a template that "
                "accepts them.",)),
    CrashCause(
        "hccl_init", "HCCL (Ascend's collective library) failed to create a communicator",
        "the collective library is HCCL (Ascend NPUs)",
        message=re.compile(r"HCCL function error: (?P<call>hccl\w+)(?:.*error code is "
                           r"(?P<code>\d+))?"),
        extract=lambda found, raised: {"code_said": f" (error code {found.group('code')})"
                                       if found and found.group("code") else ""},
        advice=("HCCL could not create its communicator ({call}{code_said}): check the HCCL "
                "setup of the devices and between the nodes: the network interface HCCL uses "
                "(HCCL_SOCKET_IFNAME), the ports between the nodes, the visible "
                "devices (ASCEND_RT_VISIBLE_DEVICES) against trainer.n_gpus_per_node; "
                "HCCL_CONNECT_TIMEOUT for slow starts.",)),
    CrashCause(
        "nccl_unavailable", "torch without NCCL, or no GPU where NCCL is asked for",
        "the process has no usable NCCL (a build without it, or no GPU visible)",
        message=_re(r"doesn't have NCCL built in|ProcessGroupNCCL is only supported with GPUs|"
                    r"NCCL is not available"),
        advice=("NCCL is not usable in this process: the installed torch has no NCCL (a CPU "
                "or ROCm build) or the process sees no GPU. Check that torch sees the GPUs in "
                "the workers' environment (CUDA_VISIBLE_DEVICES, the torch build), and "
                "trainer.n_gpus_per_node against the GPUs the node has.",)),
    CrashCause(
        "collective_on_cpu", "a collective on a CPU tensor in a group with only a GPU backend",
        "the process group serves GPU tensors only (NCCL)",
        message=re.compile(r"No backend type associated with device type cpu"),
        extract=_caller,
        advice=("A collective ran on a tensor in CPU memory, and the process group has no "
                "backend for the CPU (NCCL serves GPU tensors only): the code {caller} hands "
                "it a CPU tensor. The tensor must be on the GPU there, or the group made with "
                "a CPU backend too (gloo).",)),
    CrashCause(
        "nccl_backend_error", "torch.distributed's DistBackendError (NCCL failed)",
        "the collective's backend (NCCL on GPUs) raised", types=frozenset({"DistBackendError"}),
        extract=lambda found, raised: {"where": _where(raised)},
        advice=("A collective failed inside NCCL{where}: re-run with NCCL_DEBUG=INFO (in "
                "ray_kwargs.ray_init.runtime_env.env_vars) to see the transport that fails: "
                "the network interface (NCCL_SOCKET_IFNAME), InfiniBand (NCCL_IB_*), P2P "
                "between the GPUs (NCCL_P2P_DISABLE=1 to rule it out).",)),
    CrashCause(
        "rendezvous_unreachable", "torch.distributed's TCPStore client cannot reach the "
        "rendezvous host", "a worker waited its full connect timeout for the store's host",
        message=re.compile(r"timed out after (?P<ms>\d+)ms while trying to connect to "
                           r"\((?P<host>[^,]+), (?P<port>\d+)\)"),
        advice=("A worker could not reach the rendezvous store at {host}:{port} within its "
                "timeout: a network problem between the nodes. Check that every node reaches "
                "that address (ping), that the port is open between them (firewall, security "
                "group), and that the nodes use the network interface that can reach it "
                "(NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).",)),
    CrashCause(
        "peer_closed", "a collective's connection closed by the other side",
        "the other rank went away first: this rank's error follows that one", root=False,
        message=_re(r"Connection (?:closed|reset) by peer"),
        advice=("This rank's collective lost its peer: another rank died first, and this "
                "error only follows from it. Find the first failure in time on the other ranks "
                "(their own logs, under /tmp/ray/session_latest/logs): that is the cause.",)),
    CrashCause(
        "verl_assertion", "an AssertionError raised in verl's own code",
        "the deepest frame is verl's: verl checked its inputs or config",
        types=frozenset({"AssertionError"}), frames=re.compile(r"(?:^|/)verl/"), deepest=True,
        extract=lambda found, raised: {"said": _said(raised), **_frame_where(found, raised)},
        advise=lambda hit: _own_assertion(hit)),
    CrashCause(
        "library_assertion", "an AssertionError raised inside a library verl calls",
        "the deepest frame is a library's (vLLM, SGLang, torch, transformers ...)",
        types=frozenset({"AssertionError"}), frames=re.compile(r"^[a-z_]\w*/"), deepest=True,
        extract=lambda found, raised: {"said": _said(raised), **_frame_where(found, raised)},
        advise=lambda hit: _library_assertion(hit)),
    CrashCause(
        "message_says_fix", "the message itself says what to do (\"please export ...\", "
        "\"Try increasing ...\")", "the library that raised states its own remedy",
        message=re.compile(r"(?P<fix>(?:[Pp]lease|[Tt]ry|[Cc]onsider) (?:export|set|"
                           r"increas\w*|decreas\w*|reduc\w*|lower\w*|install|upgrade|use)"
                           r"[^.;]{3,200})"),
        advice=("The error says what to do: \"{fix}\".",)),
)


def _said(raised: Raised) -> str:
    last = raised.last
    if last is None:
        return ""
    return f"{last.name}: {last.message}" if last.message else last.name


def _source_said(found: re.Match[str] | None) -> str:
    source = found.group("source") if found is not None else None
    return f" ({source})" if source else ""


def _lengths(found: re.Match[str] | None) -> dict[str, str]:
    if found is None:
        return {}
    groups = found.groupdict()
    length = groups.get("length") or groups.get("length2") or groups.get("length3") or "?"
    limit = groups.get("limit") or groups.get("limit2") or groups.get("limit3") or "?"
    return {"length": length, "limit": limit}


def _missing_module(hit: Hit) -> list[str]:
    module = hit.values.get("module", "")
    if hit.values.get("package") == "verl":
        return [f"The installed verl has no module '{module}': the code importing it (a "
                f"recipe or a project built on verl) was written for another verl version. "
                f"Install the verl version that code pins, or a version of the code that "
                f"matches the installed verl."]
    return [f"No module '{module}' in the environment of the process that raised: install the "
            f"package that provides '{module}' there (each Ray worker imports in the "
            f"environment it was started with; ray_kwargs.ray_init.runtime_env can set it), "
            f"or run without the feature that needs it."]


def _checkpoint_file(hit: Hit) -> list[str]:
    folder, file = hit.values.get("folder", "?"), hit.values.get("file", "?")
    out = [f"The checkpoint {folder} lacks '{file}': its save was interrupted (the job ended "
           f"while writing it): load an earlier, complete checkpoint."]
    if file.endswith("fsdp_config.json"):
        out[0] = (f"The checkpoint {folder} lacks '{file}': its save was interrupted (load an "
                  f"earlier, complete checkpoint), or an older verl wrote it: verl writes "
                  f"fsdp_config.json since June 2025 (PR #2125), and its model merger reads it. "
                  f"For an older checkpoint, write it by hand: {{\"FSDP_version\": 1, "
                  f"\"world_size\": <the number of ranks that saved it>}}.")
    return out


def _dataloader_killed(hit: Hit) -> list[str]:
    pid, signal = hit.values.get("pid", "?"), hit.values.get("signal", "?").strip()
    if "bus" in signal.lower():
        return [f"A DataLoader worker (pid {pid}) died of a bus error: its shared memory "
                f"(/dev/shm) is full. Give the container more shared memory (docker "
                f"--shm-size) or lower data.dataloader_num_workers."]
    return [f"A DataLoader worker (pid {pid}) was killed ({signal}): a SIGKILL from outside, "
            f"mostly the kernel's OOM killer when the host runs out of memory (dmesg on that "
            f"node says), or the job's scheduler. Give each GPU more host memory, or use less: "
            f"lower data.dataloader_num_workers."]


def _config_key(hit: Hit) -> list[str]:
    key = hit.values.get("key") or hit.values.get("missing") or "?"
    full = hit.values.get("full_key") or key
    owner = hit.values.get("owner")
    if owner:
        return [f"The config sets '{key}', which this verl's {owner} does not have: the "
                f"override or config file is from another verl version, or misspelt. Drop it "
                f"(or use a verl whose {owner} has it)."]
    return [f"The code{hit.values.get('where', '')} reads the config key '{full}', which the "
            f"config the job loaded does not define: the config file and the code are from "
            f"different versions (a project's own config against a newer or older verl). Start "
            f"from the config that ships with the installed verl, or add the key "
            f"('+{full}=...' on the command line)."]


def _own_assertion(hit: Hit) -> list[str]:
    said = hit.values.get("said") or "AssertionError"
    return [f"verl's own check failed at {hit.values.get('where')}{hit.values.get('code')}:"
            f" {said}. The values it checks come from the job's config: compare them with "
            f"what that check needs (the message and the source line say which)."]


def _library_assertion(hit: Hit) -> list[str]:
    where = hit.values.get("where", "")
    package = where.split("/", 1)[0] if "/" in where else "the library"
    return [f"An assertion inside '{package}' failed at {where}{hit.values.get('code')}: "
            f"the check is the library's own, on what verl passed it (the model's config, the "
            f"engine's arguments). That input is mostly one this '{package}' version does not "
            f"accept: install the '{package}' version the verl release pins (or one that "
            f"supports this model)."]


__all__ = ["CAUSES", "CHECKPOINT_HOST_OOM", "CrashCause", "Hit", "Raised", "diagnose"]
