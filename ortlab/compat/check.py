"""`ortlab check`: does a model train on ORTModule, and if not, every reason why at once, where in the model, and
which fix removes it, verified by exporting again.

Three passes over the model as it is: ortlab's own export (`probe`: every ATen operator the exporter cannot
convert, not only the first), every distinct operator tried on ORT alone (`opcheck`: types, kernels, gradients,
gradient kernels), and, once nothing is left, one real ORTModule training step (forward and backward, the
parameters restored after), which also meets what only the whole graph shows. No optimizer step is taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.compat import failures, registry
from ortlab.compat.advice import PARAMETER_REMEDY, recommend, verified
from ortlab.compat.blockers import (
    BAKED_INPUT,
    BUFFER_UPDATE,
    EXPORT_FAILED,
    FROZEN_FLOW,
    UNSUPPORTED_OP,
    UNSUPPORTED_OUTPUT,
    WRONG_GRADIENT,
    Blocker,
    frames,
    merge,
    model_line,
    module_path,
)
from ortlab.compat.errors import read_error, root_message
from ortlab.compat.report import CheckReport


@dataclass
class Found:
    """What one pass found: the blockers (one per cause), the probe export (None when the export itself failed),
    and the operators ORT could not try alone (it crashed on their one-node graph)."""

    blockers: list[Blocker]
    exported: Any
    unchecked: list[str]


def find(model: Any, inputs: Any, opset: int = 17, log: Path | None = None) -> Found:
    """The export's and ORT's per-operator blockers of `model` on `inputs`."""
    from ortlab.compat import opcheck, probe
    from ortlab.runs.snapshot import kept

    try:
        with kept(model):  # the trace runs forward: buffers it mutates are put back
            exported = probe.export(model, inputs, opset, log)
    except Exception as e:
        return Found([_export_failure(e)], None, [])
    found = []
    for node in exported.unconverted():
        stack = frames(node.doc_string)
        found.append(Blocker(UNSUPPORTED_OP, f"aten::{node.op_type}", f"the exporter has no ONNX symbolic for "
                             f"aten::{node.op_type} at opset {opset}", "export", node.name, module_path(node.name),
                             model_line(stack), stack))
    found += _outputs(model, exported)
    per_op, unchecked = opcheck.check_nodes(exported)
    return Found(merge(found + failures.known_failures(exported) + per_op), exported, unchecked)


def _outputs(model: Any, exported: Any) -> list[Blocker]:
    """An output ORTModule cannot flatten (it fails at the first forward): the KV cache a Hugging Face decoder
    returns while its config's use_cache is on, named with that config."""
    from ortlab.compat.fixes.kv_cache import caching

    out = []
    for where, cls in exported.unflattened:
        message = (f"forward returns {where} as a {cls.__module__}.{cls.__qualname__}: ORTModule flattens tensors, "
                   "None, numbers, strings, sequences and mappings only (\"Unsupported flatten data type\")")
        module, configs = caching(model) if cls.__name__.endswith("Cache") else (None, [])
        if configs:
            message += (f"; it is the KV cache the model returns while {' and '.join(configs)} "
                        "(a decoder's default), which training does not use")
        out.append(Blocker(UNSUPPORTED_OUTPUT, f"{cls.__name__} at {where}", message, "export", module=module,
                           source=", ".join(configs) or None))
    return out


def _export_failure(e: BaseException) -> Blocker:
    import traceback

    stack = [f"{f.filename}({f.lineno}): {f.name}" for f in reversed(traceback.extract_tb(e.__traceback__))]
    message = root_message(e)
    read = read_error(message)
    return Blocker(EXPORT_FAILED, read.op or type(e).__name__, message, "export", source=model_line(stack),
                   stack=stack)


def check(workload: Any, fixes: Any = registry.AUTO, opset: int = 17, out: Path | None = None,
          train_step: bool = True) -> CheckReport:
    """Check a workload (its model and first batch) for ORTModule: see the module docstring. `fixes`: "auto"
    (the ones that remove what was found), "none", or fix names. The model's state is unchanged after."""
    from ortlab.stacks.versions import versions
    from ortlab.workload import to_device

    asked = registry.parse(fixes)
    model = workload.model
    inputs, target = workload.batch(0)
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        inputs, target = to_device(inputs, device), to_device(target, device)
    log = out / "log.txt" if out else None
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    model.train()
    found = find(model, inputs, opset, log)
    seconds["find"] = time.perf_counter() - started
    started = time.perf_counter()
    # every blocker with the fixes that removed it, exporting again with them (named whether applied here or not)
    recommended, with_them, blockers = verified(model, inputs, found, opset, log)
    chosen = recommended if asked == registry.AUTO else list(asked)
    if asked == registry.AUTO:
        found = with_them
    elif chosen:
        with registry.applied(model, chosen):
            found = find(model, inputs, opset, log)
            verified(model, inputs, found, opset, log, chosen)  # what is left, with the fixes that would remove it
    seconds["verify fixes"] = time.perf_counter() - started
    remaining, exported = found.blockers, found.exported
    trains = None
    hazards: list[dict[str, Any]] = []
    if train_step and not remaining:
        started = time.perf_counter()
        added: dict[str, set] = {}  # a fix a step named -> the blockers (keys) it was named for
        for attempt in range(3):  # again when the step finds what a fix removes (fixes="auto"), to see that it does
            with registry.applied(model, chosen):
                trains, remaining, hazards = step_check(workload, inputs, target, chosen, exported, log)
            left = {b.key for b in remaining}
            failed = {f: keys & left for f, keys in added.items() if keys & left}  # applied, and still there
            for b in blockers + remaining:
                b.tried += [f for f, keys in failed.items() if b.key in keys and f not in b.tried]
            chosen = [f for f in chosen if f not in failed]
            blockers += [b for b in remaining if b.key not in {x.key for x in blockers}]
            new = [f for f in recommend(remaining, model, chosen) if f not in chosen]
            if asked != registry.AUTO or not new or failed or attempt == 2:
                break
            added = {f: {b.key for b in remaining if f in b.fixes} for f in new}
            chosen = [f for f in registry.FIXES if f in chosen or f in new]
            if all(b.kind == BUFFER_UPDATE and b.fixes for b in remaining):
                # with pytorch-buffers the step differs only in not testing the buffers: the rest of it stands
                remaining, new = [], []
                break
        unverified([b for b in blockers if b.key in {x.key for x in remaining}] + remaining, chosen)
        seconds["training step"] = time.perf_counter() - started
    if not hazards and exported is not None:
        from ortlab.compat.hazards import in_torch, record, unique

        hazards = unique([record(str(w.message), w.filename, w.lineno, None, None, in_torch=in_torch(w.filename))
                          for w in exported.warnings if w.category.__name__ == "TracerWarning"])
    report = CheckReport(getattr(workload, "name", "") or type(model).__name__, blockers, chosen, remaining, trains,
                         {k: round(v, 2) for k, v in seconds.items()}, versions(), hazards, found.unchecked,
                         str(out) if out else None)
    if out:
        from ortlab.runs.run import write_json

        write_json(out / "check.json", report.to_dict())
    return report


def unverified(blockers: list[Blocker], chosen: list[str]) -> None:
    """Blockers of the last training step: fixes not applied in a step after it are not named (not seen to remove
    it), but said to be worth a try."""
    for b in blockers:
        untried = [f for f in b.fixes if f not in chosen]
        if untried:
            b.fixes = []
            b.remedy = (f"{', '.join(untried)} may remove it (not tried here: `ortlab check` with fixes=\"auto\" "
                        "tries it)")


SAMPLED_BATCHES = 8  # batches whose inputs are compared with the first's for arguments the graph bakes in


def step_check(workload: Any, inputs: Any, target: Any, fixes: list[str], exported: Any,
               log: Path | None) -> tuple[bool, list[Blocker], list[dict[str, Any]]]:
    """One ORTModule training step on a fresh ORTModule beside PyTorch's (dropout off, no optimizer step, the
    model as before after): (it trained, what it found, the export's hazards). It finds a failure or a fallback;
    and where ORTModule trains another model than PyTorch: first-step gradients that differ, arguments the
    graph bakes in that later batches change, buffers forward mutates (ORT's graph does not carry them)."""
    from ortlab import _ort
    from ortlab.compat import hazards as hz
    from ortlab.compat.inputs import InputWatch
    from ortlab.judging import verdicts

    model = workload.model
    found_hazards: list[dict[str, Any]] = []
    try:
        wrapped = _ort.new_ortmodule(model)
        with hz.captured(model, 0, found_hazards):
            gradients = verdicts().step_gradients(workload, fixes, log, wrapped, (inputs, target))
    except Exception as e:
        return False, [failures.step_failure(e, exported)], hz.unique(found_hazards)
    found_hazards = hz.unique(found_hazards)
    out = []
    if not gradients.agree:
        out.append(_wrong_gradient(gradients, exported))
    watch = InputWatch.exported(model, inputs, _ort.Wrap(wrapped, True).graph_inputs_read() or set(),
                                found_hazards)
    per_value = "graph-per-value" in fixes
    baked = [] if per_value else _baked_inputs(workload, watch)
    out += baked
    if not baked:
        from ortlab.common.capture import captured_output

        graphs = {watch.key(inputs): wrapped} if per_value else None
        with captured_output(log or Path("/dev/null")):
            out += _frozen_flow(workload, wrapped, fixes, found_hazards, watch, graphs)
    if not set(registry.PYTORCH_PASS) <= set(fixes):  # what a fix applied here advances is not a blocker
        out += [b for b in _mutated_buffers(workload, inputs)
                if not set(fixes) & set(registry.for_blocker(b, workload.model))]
    return True, out, found_hazards


def _wrong_gradient(gradients: Any, exported: Any) -> Blocker:
    """The worst parameter's gradient as a blocker; the operator named when the graph holds a pattern whose
    ORT gradient is known to be wrong (a global average pool feeding a broadcast: squeeze-and-excitation)."""
    from ortlab.compat.fixes.pooling import OP
    from ortlab.judging import verdicts

    worst = gradients.worst
    pools = _global_pools(exported) if exported is not None else []
    op = OP if pools else "gradient"
    message = verdicts().gradient_words(worst) + ("; the forward agrees" if gradients.forward_agrees else "")
    return Blocker(WRONG_GRADIENT, op, message, "training step", module=worst["module"] or None,
                   modules=[m for m in pools if m is not None])


def _global_pools(exported: Any) -> list[str | None]:
    """The modules holding ORT's ATen adaptive average pool in the exported graph (the fix global-avg-pool rewrites
    output size 1), one per node: empty when it has none."""
    from ortlab.compat.blockers import module_path
    from ortlab.compat.opcheck import op_name

    return [module_path(node.name) for node in exported.model.graph.node
            if op_name(node) == "aten::_adaptive_avg_pool2d"]


def _baked_inputs(workload: Any, watch: Any) -> list[Blocker]:
    """Arguments the graph bakes in (or shapes it traced Python on) that the next batches change."""
    from ortlab.workload import to_device

    seen: dict[str, list[str]] = {}
    device = next((p.device for p in workload.model.parameters()), None)
    for step in range(1, SAMPLED_BATCHES):
        inputs, _ = workload.batch(step)
        if device is not None:
            inputs = to_device(inputs, device)
        for change in watch.changes(inputs):
            values = seen.setdefault(change["input"], [change["old"]])
            if change["new"] not in values:
                values.append(change["new"])
    return [Blocker(BAKED_INPUT, name, f"{name} is {', '.join(values)} in the first {SAMPLED_BATCHES} batches, "
                    f"but the exported graph holds {values[0]} (baked in at export): later steps would train the "
                    "first batch's graph", "export")
            for name, values in seen.items()]


def _frozen_flow(workload: Any, wrapped: Any, fixes: list[str], found_hazards: list[dict], watch: Any,
                 graphs: dict | None) -> list[Blocker]:
    """The next batches' outputs (a workload's own step: its loss) of ORTModule's graph against PyTorch's (dropout
    off, the same parameters): a graph that froze a Python decision gives other outputs where a batch takes
    another path. Named with the hazards the export warned about in the model's own code. `graphs` (fix
    graph-per-value): a graph per distinct baked value, exported as the batches need them, as a burst with the
    fix would."""
    import torch

    from ortlab import _ort
    from ortlab.common.parity import parity
    from ortlab.compat import registry
    from ortlab.compat.probe_outputs import outputs_differ
    from ortlab.runs.snapshot import kept
    from ortlab.workload import call_model, to_device

    model = workload.model
    device = next((p.device for p in model.parameters()), None)
    first = None
    def forward(module: Any, inputs: Any, target: Any) -> Any:  # a workload's own step gives its loss, not outputs
        return call_model(module, inputs) if workload.step_loss is None else workload.forward_loss(module, inputs,
                                                                                                   target)

    with kept(model), parity(model, True, 0), registry.applied(model, fixes):
        for step in range(1, SAMPLED_BATCHES):
            inputs, target = workload.batch(step)
            if device is not None:
                inputs, target = to_device(inputs, device), to_device(target, device)
            runner = wrapped
            if graphs is not None:
                key = watch.key(inputs)
                runner = graphs[key] if key in graphs else graphs.setdefault(key, _ort.new_ortmodule(model))
            with torch.enable_grad():
                expected = forward(model, inputs, target)
                got = forward(runner, inputs, target)
            gap = outputs_differ(expected, got)
            if gap is not None:
                first = (step, gap)
                break
    if first is None:
        return []
    own = [h for h in found_hazards if h["file"] and not h["file"].startswith(("torch/", "transformers/"))
           and not h.get("in_torch")] or found_hazards
    where = "; ".join(f"{h['file'] or h.get('module')}:{h['line']} ({h['kind']})" for h in own) or \
        "no export hazard was reported"
    h = own[0] if own else {}
    return [Blocker(FROZEN_FLOW, h.get("kind", "control flow"), f"batch {first[0]}'s outputs differ from "
                    f"PyTorch's by {first[1]:.3g} (relative): the graph froze a Python decision of the first batch; "
                    f"hazards: {where}", "export", module=h.get("module"),
                    source=f"{h['file']}:{h['line']}" if h.get("file") else None,
                    remedy=h.get("advice"))]


def _mutated_buffers(workload: Any, inputs: Any) -> list[Blocker]:
    """Buffers a PyTorch forward changes (ORT's graph will not carry those changes), and parameters it changes in
    place (Embedding's max_norm renormalizes the rows it looks up): ORT's graph does neither."""
    import torch

    from ortlab.runs.snapshot import kept
    from ortlab.workload import call_model

    model = workload.model
    named = list(model.named_buffers()) + list(model.named_parameters())
    if not named:
        return []
    buffers = {name for name, _ in model.named_buffers()}
    with kept(model), torch.no_grad():
        before = [b.detach().clone() for _, b in named]
        call_model(model, inputs)
        changed = [n for (n, b), old in zip(named, before, strict=True) if not torch.equal(b, old)]
    out = []
    for op, names in (("buffers", [n for n in changed if n in buffers]),
                      ("parameters", [n for n in changed if n not in buffers])):
        if not names:
            continue
        what = ("ORT's graph does not carry the updates (they change once, in the export's own forward)"
                if op == "buffers" else "ORT's graph does not change them (the export's own forward did, once); "
                "nn.Embedding's max_norm renormalizes the rows it looks up this way")
        out.append(Blocker(BUFFER_UPDATE, op, f"forward mutates {', '.join(names)}; {what}", "training step",
                           module=owners(model, names), remedy=None if op == "buffers" else PARAMETER_REMEDY))
    return out


SHOWN_MODULES = 8  # modules a blocker's line names; its message names every tensor


def owners(model: Any, names: list[str]) -> str | None:
    """The modules that own these tensors, each named ("down1.1, down2.1, bottleneck.1 (3 BatchNorm2d modules)"),
    the first SHOWN_MODULES when there are more; "" for the root."""
    modules = list(dict.fromkeys(n.rpartition(".")[0] for n in names))
    types: dict[str, int] = {}
    for m in modules:
        kind = type(model.get_submodule(m)).__name__
        types[kind] = types.get(kind, 0) + 1
    shown = ", ".join(m or "(root)" for m in modules[:SHOWN_MODULES]) + (
        f" and {len(modules) - SHOWN_MODULES} more" if len(modules) > SHOWN_MODULES else "")
    if len(modules) == 1:
        return modules[0] or None
    kinds = ", ".join(f"{n} {kind} module{'s' if n > 1 else ''}" for kind, n in types.items())
    return f"{shown} ({kinds})"
