"""Plan ids and ORT's symbolic saving expressions: parsing them, and evaluating them safely."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ortlab.recompute.errors import PlanError

TYPE_NAMES = {1: "recompute", 2: "recompute with compromise"}

# sympy's parser evaluates text: an expression read from plans.json must be arithmetic on names and numbers
# (no attribute access: a '.' only inside a number).
_SAFE_EXPR = re.compile(r"^(?:\s+|[A-Za-z_]\w*|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\*\*|[-+*/()])*$")
_NAME = re.compile(r"[A-Za-z_]\w*")
PLAN_ID = re.compile(r"^(?P<subgraph>[^:,\s]+):(?P<type>-?\d+)(?::(?P<count>-?\d+))?$")


def parse_cluster(cluster_id: str) -> list[tuple[str, int, int]]:
    """'A+:1:-1,B+:2:-1' -> [(subgraph, type, count), ...]: ORT joins one node cluster's options by commas."""
    parts = []
    for text in cluster_id.split(","):
        subgraph, opt_type, count = text.rsplit(":", 2)
        parts.append((subgraph, int(opt_type), int(count)))
    return parts


def requested(config_entries: Iterable[str]) -> dict[str, int]:
    """{'subgraph:type': count} that a config asks for (count 0 means off), as ORT's display reads it."""
    out: dict[str, int] = {}
    for entry in config_entries:
        for text in filter(None, entry.split(",")):
            subgraph, opt_type, count = text.strip().rsplit(":", 2)
            if int(count) != 0:
                out[f"{subgraph}:{opt_type}"] = int(count)
    return out


def symbols(expr: str) -> list[str]:
    return sorted(set(_NAME.findall(expr)))


def evaluate(expr: str, dims: Mapping[str, int]) -> float | None:
    """The value of a saving expression for these dimension values (None if a symbol has no value)."""
    import sympy

    if not _SAFE_EXPR.match(expr) or "__" in expr:
        raise PlanError(f"saving expression {expr!r} is not plain arithmetic; refusing to evaluate it")
    local = {name: sympy.Symbol(name) for name in symbols(expr)}  # E, I, N stay symbols, not constants
    values = {local[k]: v for k, v in dims.items() if k in local}
    value = sympy.parse_expr(expr, local_dict=local).subs(values)
    return float(value) if value.is_number else None


def value_or_none(expr: str, dims: Mapping[str, int]) -> float | None:
    try:
        return evaluate(expr, dims)
    except Exception:  # an expression sympy cannot take: keep the plan, without a value
        return None
