"""What each ORTModule option, and each burst setting ORTModule needed (its optimizers, its fp16), becomes on the
newest torch: the torch.compile / PyTorch feature, a snippet to paste, and the torch names it uses (checked to
exist on both stacks by tests/test_move.py). An option with no equivalent says so and why none is needed.

Plain data, read by `ortlab.move.report` (the move report), docs/compile.md and the Lab's Move tab.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field, replace
from typing import Any

from ortlab.common.enums import StrEnum


class Fit(StrEnum):
    """How close the newest torch comes to what the option did."""

    SAME = "same"  # a feature that does the same job
    PARTIAL = "partial"  # does part of the job, or the job differently
    BUILT_IN = "built in"  # torch.compile (or PyTorch) does it without being asked: nothing to set
    NONE = "no equivalent"  # nothing to set; `why` says why none is needed (or what to do instead)


@dataclass(frozen=True)
class Equivalent:
    """One ORTModule option (or setting) on the newest torch: what it becomes, a snippet, the torch names used."""

    option: str  # an ortlab.options name, or a burst setting: "wrap", "optimizer", "precision"
    becomes: str
    snippet: str = ""
    apis: tuple[str, ...] = ()  # dotted torch names; "name(param)" checks a parameter of a callable
    fit: Fit = Fit.SAME
    why: str = ""  # for PARTIAL/NONE/BUILT_IN: why, in one sentence
    values: dict[str, Equivalent] = field(default_factory=dict)  # a value that changes the answer -> its entry

    def of(self, value: Any) -> Equivalent:
        """The entry for the option set to `value` (an option whose answer depends on its value: the fallback
        policy, the memory optimizer's level, the optimizer, the precision)."""
        return self.values.get(str(value), self)

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain data (its value variants apart)."""
        return {"option": self.option, "becomes": self.becomes, "snippet": self.snippet, "apis": list(self.apis),
                "fit": self.fit.value, "why": self.why}


# The torch names above 2.6 (the ort stack's torch): checked on the current stack only.
SINCE = {"torch.compiler.save_cache_artifacts": (2, 7), "torch._dynamo.config.recompile_limit": (2, 7)}

_COMPILE = "model = torch.compile(model)"
_LOGS = "torch._logging.set_logs"
_CKPT = ("# each repeated block (a transformer layer) recomputed in backward:\n"
         "from torch.utils.checkpoint import checkpoint\n"
         "x = checkpoint(block, x, use_reentrant=False)\n"
         "# or, under torch.compile, a budget the partitioner recomputes to (0: recompute all, 1: none):\n"
         "torch._functorch.config.activation_memory_budget = {budget}")
_SDPA = ("from torch.nn.attention import SDPBackend, sdpa_kernel\n"
         "with sdpa_kernel(SDPBackend.{kernel}):\n"
         "    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)")


def _e(option: str, becomes: str, snippet: str = "", apis: tuple[str, ...] = (), fit: Fit = Fit.SAME,
       why: str = "", **values: Equivalent) -> Equivalent:
    return Equivalent(option, becomes, snippet, apis, fit, why, values)


def _none(option: str, why: str, snippet: str = "", apis: tuple[str, ...] = ()) -> Equivalent:
    return Equivalent(option, "no equivalent", snippet, apis, Fit.NONE, why)


def _built_in(option: str, becomes: str, why: str, snippet: str = "", apis: tuple[str, ...] = (),
              **values: Equivalent) -> Equivalent:
    return Equivalent(option, becomes, snippet, apis, Fit.BUILT_IN, why, values)


_FALLBACK_DEFAULT = _e(
    "fallback_policy", "torch.compile's graph breaks: what dynamo cannot trace runs eagerly, the rest compiled; "
    "see each break with TORCH_LOGS=graph_breaks or torch._dynamo.explain",
    "model = torch.compile(model)  # breaks run eagerly\n"
    "print(torch._dynamo.explain(model)(x).break_reasons)", ("torch.compile", "torch._dynamo.explain"), Fit.PARTIAL,
    "ORT falls back for the whole model; torch.compile only for the code it cannot trace")

MAPPING: tuple[Equivalent, ...] = (
    # The wrap and the burst settings ORTModule's users chose with it
    _e("wrap", "torch.compile", "model = torch.compile(model)  # was: model = ORTModule(model)", ("torch.compile",)),
    _e("optimizer", "the same torch.optim optimizer", "optimizer = torch.optim.AdamW(model.parameters(), lr=lr)",
       ("torch.optim.AdamW",),
       fused_adam=_e("optimizer", "torch.optim.AdamW(fused=True): one fused kernel per step (CUDA, and the CPU from "
                     "torch 2.4)", "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
                     ("torch.optim.AdamW(fused)",)),
       fp16_optimizer=_e("optimizer", "AMP: torch.autocast(float16) with torch.amp.GradScaler (master weights stay "
                         "fp32 in the model)",
                         "scaler = torch.amp.GradScaler('cuda')\n"
                         "with torch.autocast('cuda', dtype=torch.float16):\n    loss = model(x)\n"
                         "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()",
                         ("torch.autocast", "torch.amp.GradScaler")),
       sgd=_e("optimizer", "the same: torch.optim.SGD", "optimizer = torch.optim.SGD(model.parameters(), lr=lr, "
              "momentum=0.9)", ("torch.optim.SGD",)),
       zero1=_e("optimizer", "the same: ZeroRedundancyOptimizer (or FSDP2's fully_shard for ZeRO-2/3)",
                "from torch.distributed.optim import ZeroRedundancyOptimizer\n"
                "optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)",
                ("torch.distributed.optim.ZeroRedundancyOptimizer",))),
    _built_in("precision", "float32: nothing to set", "fp32 trains the same on both",
              fp16=_e("precision", "AMP: torch.autocast(float16) with torch.amp.GradScaler",
                      "scaler = torch.amp.GradScaler('cuda')\nwith torch.autocast('cuda', dtype=torch.float16):\n"
                      "    loss = model(x)\nscaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()",
                      ("torch.autocast", "torch.amp.GradScaler")),
              bf16=_e("precision", "torch.autocast(bfloat16), no GradScaler (bfloat16 has float32's range)",
                      "with torch.autocast(device_type, dtype=torch.bfloat16):\n    loss = model(x)",
                      ("torch.autocast",))),
    # DebugOptions and logging
    _e("log_level", "TORCH_LOGS (or torch._logging.set_logs): dynamo's and inductor's logs at the chosen level",
       "TORCH_LOGS=dynamo,inductor,graph_breaks,recompiles python train.py\n"
       "# in Python: torch._logging.set_logs(dynamo=logging.INFO, graph_breaks=True, recompiles=True)",
       (f"{_LOGS}(dynamo)", f"{_LOGS}(graph_breaks)", f"{_LOGS}(recompiles)"),
       VERBOSE=_e("log_level", "TORCH_LOGS=+dynamo,+inductor (debug level)", "TORCH_LOGS=+dynamo,+aot,+inductor "
                  "python train.py", (f"{_LOGS}(dynamo)", f"{_LOGS}(inductor)")),
       DEVINFO=_e("log_level", "TORCH_LOGS=+dynamo,+inductor (debug level)", "TORCH_LOGS=+dynamo,+aot,+inductor "
                  "python train.py", (f"{_LOGS}(dynamo)", f"{_LOGS}(inductor)")),
       WARNING=_built_in("log_level", "torch.compile's default logging (warnings only)", "nothing to set")),
    _e("save_onnx", "torch.compile's graphs and generated code: TORCH_LOGS=graph_code,output_code, or a trace "
       "tlparse turns into a page (TORCH_TRACE)",
       "TORCH_LOGS=aot_graphs,output_code python train.py\n"
       "TORCH_TRACE=trace python train.py && tlparse trace/*.log",
       (f"{_LOGS}(graph_code)", f"{_LOGS}(output_code)", f"{_LOGS}(aot_graphs)"), Fit.PARTIAL,
       "FX graphs and Triton/C++ code instead of ONNX files; netron does not open them"),
    _none("onnx_prefix", "not needed: torch.compile writes no ONNX files; TORCH_TRACE names its files itself"),
    _e("save_onnx_path", "TORCH_TRACE=<folder> (tlparse reads it) or torch._dynamo.config.debug_dir_root "
       "(TORCH_COMPILE_DEBUG's folder)", "TORCH_TRACE=/path/to/folder python train.py\n"
       "torch._dynamo.config.debug_dir_root = '/path/to/folder'", ("torch._dynamo.config.debug_dir_root",)),
    _none("onnx_opset_version", "not needed: torch.compile trains the model as FX graphs, with no ONNX export "
          "(torch.onnx.export's opset_version is for an inference export, not training)"),
    # Fallback
    replace(_FALLBACK_DEFAULT, values=dict(
       FALLBACK_DISABLE=_e("fallback_policy", "torch.compile(fullgraph=True): a graph break is an error, as ORT's "
                           "failure is with the fallback off", "model = torch.compile(model, fullgraph=True)",
                           ("torch.compile(fullgraph)",)),
       **{name: _e("fallback_policy", "torch.compiler.disable on what must run eagerly; "
                   "torch._dynamo.config.suppress_errors=True falls back to eager on a compile error",
                   "block.forward = torch.compiler.disable(block.forward)\n"
                   "torch._dynamo.config.suppress_errors = True",
                   ("torch.compiler.disable", "torch._dynamo.config.suppress_errors"), Fit.PARTIAL,
                   "no per-reason policy: torch.compile breaks the graph where tracing fails, whatever the reason")
          for name in ("FALLBACK_FORCE_TORCH_FORWARD", "FALLBACK_FORCE_TORCH_BACKWARD",
                       "FALLBACK_UNSUPPORTED_DEVICE", "FALLBACK_UNSUPPORTED_DATA",
                       "FALLBACK_UNSUPPORTED_TORCH_MODEL", "FALLBACK_UNSUPPORTED_ONNX_MODEL",
                       "FALLBACK_BAD_INITIALIZATION")})),
    _built_in("fallback_retry", "recompilation: a guard that fails recompiles on the next call, up to "
              "torch._dynamo.config.recompile_limit (cache_size_limit up to torch 2.6)",
              "torch.compile retries by itself", "torch._dynamo.config.recompile_limit = 16",
              ("torch._dynamo.config.recompile_limit", "torch._dynamo.config.cache_size_limit")),
    # PythonOp (torch.autograd.Function)
    _built_in("allow_autograd_checkpoint", "torch.utils.checkpoint under torch.compile", "dynamo traces "
              "non-reentrant checkpointing; nothing to allow", "x = checkpoint(block, x, use_reentrant=False)",
              ("torch.utils.checkpoint.checkpoint",)),
    _built_in("enable_custom_autograd", "torch.autograd.Function traced by dynamo; torch.library.custom_op for an "
              "op that must stay opaque", "dynamo traces autograd.Function's forward and backward",
              "@torch.library.custom_op('mylib::op', mutates_args=())\ndef op(x: torch.Tensor) -> torch.Tensor: ...",
              ("torch.library.custom_op",)),
    # Optimizations
    _built_in("enable_compute_optimizer", "Inductor's own graph passes (fusion, pattern rewrites), always on; "
              "torch._inductor.config.pattern_matcher=False turns the rewrites off",
              "no FLOP-reduction pass to switch: Inductor fuses instead",
              "torch._inductor.config.pattern_matcher = False  # only to rule its rewrites out",
              ("torch._inductor.config.pattern_matcher",)),
    _none("enable_sparse_optimizer", "not needed: onnxruntime-training 1.19.2 never reads it"),
    _none("enable_label_sparse_optimizer", "torch.compile computes the loss over every position; drop ignored "
          "labels before the loss yourself (a data-dependent shape: let dynamo capture it)",
          "keep = labels != -100\nloss = F.cross_entropy(logits[keep], labels[keep])\n"
          "torch._dynamo.config.capture_dynamic_output_shape_ops = True",
          ("torch._dynamo.config.capture_dynamic_output_shape_ops",)),
    _none("enable_embedding_sparse_optimizer", "torch.compile computes padded positions: pack sequences without "
          "padding (the batch's shape) to save what ORT skipped"),
    _none("print_input_density", "not needed by torch.compile: compute the density in the loop if wanted",
          "print(float((labels != -100).float().mean()))"),
    _e("print_memory_stats", "torch.cuda's allocator statistics and memory snapshots",
       "print(torch.cuda.max_memory_allocated() / 2**20, 'MB')\ntorch.cuda.memory._record_memory_history()",
       ("torch.cuda.max_memory_allocated", "torch.cuda.memory._record_memory_history")),
    _e("cache_dir", "Inductor's caches (FX graph and autotuning, on by default, TORCHINDUCTOR_CACHE_DIR) and "
       "their portable artifacts (torch.compiler.save_cache_artifacts, torch 2.7+)",
       "TORCHINDUCTOR_CACHE_DIR=/path/to/cache python train.py\n"
       "artifacts = torch.compiler.save_cache_artifacts()  # later: torch.compiler.load_cache_artifacts(...)",
       ("torch._inductor.config.fx_graph_cache", "torch.compiler.save_cache_artifacts")),
    _e("use_efficient_attention", "F.scaled_dot_product_attention (picks the efficient kernel itself; "
       "sdpa_kernel pins one)", _SDPA.format(kernel="EFFICIENT_ATTENTION"),
       ("torch.nn.functional.scaled_dot_product_attention", "torch.nn.attention.sdpa_kernel",
        "torch.nn.attention.SDPBackend")),
    _built_in("deepcopy_before_model_export", "nothing to copy", "torch.compile does not copy the module"),
    _e("memory_opt_level", "activation checkpointing of each transformer layer (torch.utils.checkpoint), or "
       "torch.compile's activation memory budget", _CKPT.format(budget=0.5),
       ("torch.utils.checkpoint.checkpoint", "torch._functorch.config.activation_memory_budget"),
       **{"2": _e("memory_opt_level", "activation checkpointing of each layer and a lower activation memory budget "
                  "(also the compromised recomputes)", _CKPT.format(budget=0.2),
                  ("torch.utils.checkpoint.checkpoint", "torch._functorch.config.activation_memory_budget"))}),
    _e("memory_opt_config", "selective activation checkpointing: the ops the plans recomputed, as a policy",
       "from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts\n"
       "def policy(ctx, op, *args, **kwargs):  # the plans' recomputed ops: recompute, else save\n"
       "    return CheckpointPolicy.PREFER_RECOMPUTE if op in RECOMPUTE else CheckpointPolicy.MUST_SAVE\n"
       "x = checkpoint(block, x, use_reentrant=False,\n"
       "               context_fn=lambda: create_selective_checkpoint_contexts(policy))",
       ("torch.utils.checkpoint.create_selective_checkpoint_contexts", "torch.utils.checkpoint.CheckpointPolicy"),
       Fit.PARTIAL, "a plan names ORT graph clusters; the policy names aten ops"),
    _built_in("enable_mem_efficient_grad_mgmt", "autograd hands each gradient over as it is computed; "
              "register_post_accumulate_grad_hook steps the optimizer per parameter",
              "PyTorch frees nothing later than ORT's grad management did",
              "param.register_post_accumulate_grad_hook(lambda p: step_one(p))",
              ("torch.Tensor.register_post_accumulate_grad_hook",)),
    _e("enable_zero_stage3", "FSDP2: torch.distributed.fsdp.fully_shard (ZeRO-3's sharding in PyTorch)",
       "from torch.distributed.fsdp import fully_shard\nfor layer in model.layers:\n    fully_shard(layer)\n"
       "fully_shard(model)", ("torch.distributed.fsdp.fully_shard",)),
    _e("conv_algo_search", "torch.backends.cudnn.benchmark (True: EXHAUSTIVE, False: HEURISTIC)",
       "torch.backends.cudnn.benchmark = False", ("torch.backends.cudnn.benchmark",),
       EXHAUSTIVE=_e("conv_algo_search", "torch.backends.cudnn.benchmark = True",
                     "torch.backends.cudnn.benchmark = True", ("torch.backends.cudnn.benchmark",))),
    _e("skipcheck_policy", "torch.compile's guards do the per-call checks; set_stance(skip_guard_eval_unsafe=True) "
       "skips them once the inputs are known not to change", "torch.compiler.set_stance(skip_guard_eval_unsafe=True)",
       ("torch.compiler.set_stance(skip_guard_eval_unsafe)",), Fit.PARTIAL,
       "unsafe: a changed input runs a wrong graph"),
    _built_in("aten_sdpa_fallback", "scaled_dot_product_attention kept as one op", "Inductor lowers "
              "F.scaled_dot_product_attention to the flash/efficient kernels; nothing is decomposed",
              "out = torch.nn.functional.scaled_dot_product_attention(q, k, v)",
              ("torch.nn.functional.scaled_dot_product_attention",)),
    # Triton
    _built_in("use_triton", "Inductor's generated Triton kernels (CUDA; C++ on the CPU)", "torch.compile "
              "generates Triton kernels for the whole graph by default", _COMPILE, ("torch.compile",)),
    _e("triton_config_file", "torch._inductor.config (which backends the GEMMs may use, and so on)",
       "torch._inductor.config.max_autotune_gemm_backends = 'TRITON,ATEN'",
       ("torch._inductor.config.max_autotune_gemm_backends",), Fit.PARTIAL,
       "Inductor decides which ops become Triton kernels; its config sets how, not which"),
    _e("enable_tuning", "torch.compile(mode='max-autotune')", "model = torch.compile(model, mode='max-autotune')",
       ("torch.compile(mode)",)),
    _none("max_tuning_duration_ms", "Inductor has no time limit for autotuning; mode='max-autotune-no-cudagraphs' "
          "or fewer GEMM backends shorten it",
          "torch._inductor.config.max_autotune_gemm_backends = 'ATEN,TRITON'",
          ("torch._inductor.config.max_autotune_gemm_backends",)),
    _built_in("tuning_results_path", "Inductor's autotuning cache (in TORCHINDUCTOR_CACHE_DIR)", "kept and read "
              "again by itself", "TORCHINDUCTOR_CACHE_DIR=/path/to/cache python train.py",
              ("torch._inductor.config.fx_graph_cache",)),
    _e("use_flash_attention", "F.scaled_dot_product_attention with the flash kernel",
       _SDPA.format(kernel="FLASH_ATTENTION"),
       ("torch.nn.functional.scaled_dot_product_attention", "torch.nn.attention.sdpa_kernel",
        "torch.nn.attention.SDPBackend")),
    _e("triton_debug", "Inductor's generated code: TORCH_LOGS=output_code (or TORCH_COMPILE_DEBUG=1)",
       "TORCH_LOGS=output_code python train.py", (f"{_LOGS}(output_code)", "torch._inductor.config.trace.enabled")),
)

BY_OPTION: dict[str, Equivalent] = {e.option: e for e in MAPPING}
SETTINGS = ("wrap", "optimizer", "precision")  # what is not an ORTModule option but moves too


def equivalent(option: str, value: Any = None) -> Equivalent:
    """The newest-torch entry for an ortlab option name (or "wrap", "optimizer", "precision") set to `value`."""
    return BY_OPTION[option].of(value)


def every_api() -> dict[str, tuple[int, int]]:
    """{torch name: the torch (major, minor) it needs} of every entry and value (what the tests check)."""
    names = {api for e in MAPPING for entry in (e, *e.values.values()) for api in entry.apis}
    return {api: SINCE.get(api.split("(")[0], (2, 6)) for api in sorted(names)}


def has_api(name: str) -> bool:
    """Whether this process's torch has `name` (a dotted name; "callable(param)": that callable takes `param`)."""
    dotted, _, param = name.partition("(")
    parts = dotted.split(".")
    obj: Any = None
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        break
    else:
        return False
    for part in rest:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    if param:
        try:
            return param.rstrip(")") in inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return False
    return True
