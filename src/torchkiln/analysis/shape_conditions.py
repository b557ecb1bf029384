"""Conditions on dynamic dims: `x.size(1) > 64` where the size is a dynamic dim whose range does not settle it.

Such a condition is not a build-time value (a range that settles it is: the evaluator gives a bool, and lowering
folds the If it decides), nor does it read tensor data: the input shapes decide it. A *shape condition* is

- a comparison of two ints, at least one a dynamic dim, that their ranges do not decide;
- `not` of a shape condition;
- the `and` / `or` TorchScript writes as an If giving one bool (`a and b` is `b if a else False`) whose condition
  is a shape condition and whose blocks hold only build-time values and shape conditions, and return one of those.

Partitioning keeps one in an engine where it is read only as a condition, and conversion makes it a 0-d bool tensor
computed from the input shapes (`conversion/control_flow.py`), so an If on it becomes a conditional layer whose
predicate is shape-only (`ir/shape_only.py`). Both phases ask this module, so they agree on what qualifies.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchkiln.analysis.resolve import NotStatic, is_dynamic
from torchkiln.ir.symbolic import decide, is_symbolic
from torchkiln.torchscript import Node, Value

COMPARISONS = {"aten::eq": "eq", "aten::ne": "ne", "aten::lt": "lt", "aten::gt": "gt", "aten::le": "le",
               "aten::ge": "ge"}
Resolve = Callable[[Value], Any]


def _is_dim(x: Any) -> bool:
    return is_symbolic(x) or isinstance(x, int) and not isinstance(x, bool)


def dim_comparison(node: Node, resolve: Resolve) -> tuple[str, Any, Any] | None:
    """(op, a, b) where `node` compares two ints, at least one a dynamic dim, and their ranges do not decide it
    (op: eq, ne, lt, le, gt, ge as `ir.symbolic.decide` names them); else None."""
    op = COMPARISONS.get(node.kind())
    if op is None or node.inputsSize() != 2 or node.outputsSize() != 1:
        return None
    try:
        a, b = resolve(node.inputsAt(0)), resolve(node.inputsAt(1))
    except NotStatic:
        return None
    if not (_is_dim(a) and _is_dim(b)) or not (is_symbolic(a) or is_symbolic(b)) or decide(op, a, b) is not None:
        return None
    return op, a, b


def static_bool(v: Value, resolve: Resolve) -> bool | None:
    """The build-time bool `v` holds, else None."""
    try:
        value = resolve(v)
    except NotStatic:
        return None
    return value if isinstance(value, bool) else None


def _static(node: Node, resolve: Resolve) -> bool:
    """Whether every output of `node` (it has some) is a build-time value."""
    try:
        return node.outputsSize() > 0 and not any(is_dynamic(resolve(o)) for o in node.outputs())
    except NotStatic:
        return False


def is_shape_condition(node: Node, resolve: Resolve) -> bool:
    """Whether `node` gives a shape condition (see the module docstring)."""
    if node.kind() in COMPARISONS:
        return dim_comparison(node, resolve) is not None
    if node.kind() == "aten::__not__":
        return is_shape_condition(node.inputsAt(0).node(), resolve)
    if node.kind() != "prim::If" or node.outputsSize() != 1 or node.output().type().kind() != "BoolType":
        return False
    if not is_shape_condition(node.inputsAt(0).node(), resolve):
        return False
    for block in node.blocks():
        if not all(_static(inner, resolve) or is_shape_condition(inner, resolve) for inner in block.nodes()):
            return False
        result = list(block.outputs())[0]
        if static_bool(result, resolve) is None and not is_shape_condition(result.node(), resolve):
            return False
    return True
