"""ORT's symbolic dimensions evaluated at concrete values: `input_ids_dim0*input_ids_dim1`, `labels_dim1 + 1`.

ORT's symbolic shape inference writes sympy-printed expressions into the saved graph. They are evaluated here
with Python's own parser restricted to arithmetic on names and numbers (no text is ever executed), exactly in
rationals, and accepted only when the result is a whole number >= 0.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, cast

from ortlab.errors import OrtlabError

_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "floor": math.floor, "ceil": math.ceil, "ceiling": math.ceil, "Min": min, "Max": max, "min": min, "max": max,
    "Abs": abs, "abs": abs, "Mod": lambda a, b: a % b, "FloorDiv": lambda a, b: a // b}
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: Fraction(a) / Fraction(b), ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b, ast.Pow: lambda a, b: a**b}


class _Unknown(OrtlabError):
    """A name without a value, or text that is not arithmetic."""


def _eval(node: ast.AST, values: Mapping[str, int]):
    if isinstance(node, ast.Expression):
        return _eval(node.body, values)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(cast(float, node.value))
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise _Unknown(node.id)
        return Fraction(values[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, values)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, values), _eval(node.right, values)
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise _Unknown("division by zero")
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or right < 0 or right > 64):
            raise _Unknown("power")
        return Fraction(_BINARY[type(node.op)](left, right))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords and node.args):
        return Fraction(_FUNCTIONS[node.func.id](*[_eval(a, values) for a in node.args]))
    raise _Unknown(type(node).__name__)


def evaluate(expr: str, values: Mapping[str, int]) -> int | None:
    """The whole number `expr` stands for at `values`, or None (a name without a value, not arithmetic, not a
    whole number >= 0)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        result = _eval(tree, values)
    except (SyntaxError, ValueError, TypeError, OverflowError, RecursionError, _Unknown):
        return None
    return int(result) if result.denominator == 1 and result >= 0 else None


def names_in(expr: str) -> set[str]:
    """The symbol names an expression uses (empty when it does not parse)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return set()
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - calls
