"""Conditions on dynamic dims: `x.size(1) > 64` where the size is a dynamic dim whose range does not settle it.

Such a comparison is not a build-time value (a range that settles it is: the evaluator gives a bool, and lowering
folds the If it decides), nor does it read tensor data: the input shapes decide it. Partitioning keeps it in an
engine where it is read only as a condition, and conversion makes it a 0-d bool tensor computed from the input
shapes (`conversion/control_flow.py`), so an If on it becomes a conditional layer whose predicate is shape-only
(`ir/shape_only.py`). Both phases ask `shape_comparison`, so they agree on what qualifies.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchkiln.analysis.resolve import NotStatic
from torchkiln.ir.symbolic import decide, is_symbolic
from torchkiln.torchscript import Node, Value

COMPARISONS = {"aten::eq": "eq", "aten::ne": "ne", "aten::lt": "lt", "aten::gt": "gt", "aten::le": "le",
               "aten::ge": "ge"}


def _is_dim(x: Any) -> bool:
    return is_symbolic(x) or isinstance(x, int) and not isinstance(x, bool)


def shape_comparison(node: Node, resolve: Callable[[Value], Any]) -> tuple[str, Any, Any] | None:
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
