"""The search space: which ORTModule options can change a step's time or its memory, the values tried against
the defaults, the recompute plans ORT found for this model, and what is pruned before anything runs (with why).

Read off the registry (ortlab.options): an option that needs CUDA is pruned on the CPU, one that 1.19.2 never reads
is pruned, one ORT reads at import is kept (the Session starts a fresh worker for it). Plans come from the
baseline's own plans table (ortlab.recompute), so a plan that does not exist for this model is never tried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortlab.options import SPECS, Options, ReadAt
from ortlab.tuning.errors import TuneError

# option -> (values tried instead of the default, why it can change speed or memory)
TRIALS: dict[str, tuple[tuple[Any, ...], str]] = {
    "enable_compute_optimizer": ((False,), "moves shrinking ops earlier: fewer FLOPs, or an overhead where none "
                                           "shrink"),
    "enable_label_sparse_optimizer": ((False,), "skips padded labels in the loss"),
    "enable_embedding_sparse_optimizer": ((False,), "skips padded rows of embedding inputs"),
    "enable_sparse_optimizer": ((False,), "documented input-sparsity switch"),
    "deepcopy_before_model_export": ((False,), "no copy of the module at export: a lower process peak"),
    "enable_mem_efficient_grad_mgmt": ((True,), "hands each gradient to PyTorch as soon as ORT has it"),
    "enable_custom_autograd": ((False,), "inlines torch.autograd.Function instead of PythonOps"),
    "memory_opt_level": ((1, 2), "recomputes activations in backward instead of keeping them"),
    "enable_zero_stage3": ((True,), "DeepSpeed ZeRO stage 3 parameter partitioning"),
    "use_efficient_attention": ((True,), "PyTorch's efficient attention kernel"),
    "aten_sdpa_fallback": ((True,), "scaled_dot_product_attention as one ATen op"),
    "use_triton": ((True,), "Triton kernels for some ops"),
    "use_flash_attention": ((True,), "Triton's Flash Attention"),
    "enable_tuning": ((True,), "online tuning of ops with several implementations"),
    "conv_algo_search": (("EXHAUSTIVE",), "cuDNN's exhaustive convolution algorithm search"),
}
# option -> the option (and value) it only acts with
NEEDS: dict[str, tuple[str, Any]] = {
    "enable_label_sparse_optimizer": ("enable_compute_optimizer", True),
    "enable_embedding_sparse_optimizer": ("enable_compute_optimizer", True),
    "enable_mem_efficient_grad_mgmt": ("enable_custom_autograd", True),
    "use_flash_attention": ("use_triton", True),
}
PLANS_TRIED = 2  # the largest plans, each alone (a memory_opt_config file); the levels cover the rest


@dataclass(frozen=True)
class Candidate:
    """One setting to measure: its name in the tables, the options it sets (beside the defaults), and the
    recompute plans (cluster:type:count entries) it applies through memory_opt_config, if any."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    plans: tuple[str, ...] = ()
    knobs: tuple[str, ...] = ()  # the single candidates it combines (itself for a single one)

    @property
    def restart(self) -> bool:
        """Whether it needs a fresh worker (an option ORT reads only at import)."""
        return any(SPECS[k].read_at is ReadAt.IMPORT for k in self.options)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "options": dict(self.options), "plans": list(self.plans),
                "knobs": list(self.knobs), "restart": self.restart}


@dataclass(frozen=True)
class Pruned:
    """A candidate not run, and why."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


def label(option: str, value: Any) -> str:
    return f"{option}={value}"


def singles(cuda: bool, plans=None, only: Iterable[str] | None = None,
            top_plans: int = PLANS_TRIED) -> tuple[list[Candidate], list[Pruned]]:
    """One candidate per option value that differs from the default (one knob at a time) and per large plan,
    and the pruned ones with their reason. `plans`: the baseline's plans table (ortlab.recompute.plans), None
    when it could not be read; `only`: the option names (or "plans") to search, default all of TRIALS."""
    wanted = _only(only)
    kept: list[Candidate] = []
    pruned: list[Pruned] = []
    for option, (values, _why) in TRIALS.items():
        if wanted is not None and option not in wanted:
            continue
        for value in values:
            name = label(option, value)
            reason = _prune_reason(option, value, cuda, plans)
            if reason:
                pruned.append(Pruned(name, reason))
            else:
                kept.append(Candidate(name, {option: value}, knobs=(name,)))
    if wanted is None or "plans" in wanted:
        found, why_not = plan_candidates(plans, top_plans)
        kept += found
        pruned += why_not
    return kept, pruned


def _only(only: Iterable[str] | None) -> set[str] | None:
    if only is None:
        return None
    names = [only] if isinstance(only, str) else list(only)
    out = set()
    for name in names:
        name = name.strip()
        if name == "plans":
            out.add(name)
            continue
        key = name.lower().removeprefix("ortmodule_")
        if key not in TRIALS:
            raise TuneError(f"option {name!r} is not searched by tune; allowed: {', '.join(TRIALS)}, plans")
        out.add(key)
    return out


def _prune_reason(option: str, value: Any, cuda: bool, plans) -> str | None:
    spec = SPECS[option]
    if spec.read_at is ReadAt.NEVER:
        return "onnxruntime-training 1.19.2 never reads it: setting it changes nothing"
    if spec.needs_cuda and not cuda:
        return "needs CUDA; this machine has no CUDA GPU"
    if option == "enable_zero_stage3":
        return "needs DeepSpeed ZeRO stage 3 around the model, and ORT cannot turn it off again in the process"
    if option == "memory_opt_level":
        if plans is None:
            return "the baseline's recompute plans could not be read"
        if not len(plans):
            return "no recompute plan exists for this model (ORT found none in the baseline's graph)"
        if value == 2 and not (plans["type"] == 2).any():
            return "level 2 adds compromised (type 2) plans; this model has none, so it equals level 1"
    return None


def plan_candidates(plans, top: int = PLANS_TRIED) -> tuple[list[Candidate], list[Pruned]]:
    """The `top` largest plans of the baseline, each alone, as memory_opt_config candidates."""
    from ortlab.recompute import plan_config

    if plans is None or not len(plans) or top < 1:
        why = ("the baseline's recompute plans could not be read" if plans is None else
               "no recompute plan exists for this model" if not len(plans) else None)
        return [], ([Pruned("plans", why)] if why else [])
    out = []
    for number, cluster in list(zip(plans["plan"], plans["cluster_id"], strict=True))[:top]:
        entries = tuple(plan_config([int(number)], plans))
        name = f"plan {int(number)}: {cluster.rsplit(':', 2)[0]}"
        out.append(Candidate(name, {}, entries, knobs=(name,)))
    return out, []


def combined(winners: Sequence[Candidate]) -> Candidate | Pruned:
    """The winners' settings together: one Candidate, or Pruned when they cannot go together (two recompute
    settings: ORT applies the config file and the level's plans as one choice; an option set without the option
    it needs)."""
    name = " + ".join(w.name for w in winners)
    options: dict[str, Any] = {}
    plans: list[str] = []
    for w in winners:
        for key, value in w.options.items():
            if key in options and options[key] != value:
                return Pruned(name, f"{key} takes one value ({options[key]!r} and {value!r})")
            options[key] = value
        plans += w.plans
    if plans and options.get("memory_opt_level", 0):
        return Pruned(name, "a plan file and a memory_opt_level > 0 both choose the recompute plans: one of them")
    merged = Options(options)
    for key, (needed, value) in NEEDS.items():
        if key in merged and merged[needed] != value:
            return Pruned(name, f"{key} acts only with {needed}={value}, which this combination turns off: it would "
                                "change nothing")
    return Candidate(name, options, tuple(dict.fromkeys(plans)),
                     knobs=tuple(k for w in winners for k in w.knobs))


def options_of(candidate: Candidate, base: Options, plan_file=None) -> Options:
    """The Options a candidate's burst runs with: `base` (what every burst of the tuning shares) and its own."""
    options = base.replace(**candidate.options)
    if candidate.plans:
        if plan_file is None:
            raise TuneError(f"candidate {candidate.name!r} applies plans but no plan file was written")
        options = options.replace(memory_opt_config=str(plan_file))
    return options
