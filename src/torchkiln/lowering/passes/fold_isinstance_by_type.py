"""Fold isinstance by type: `isinstance(x, T)` whose answer the static type of `x` gives becomes a constant, and the
prim::If it decides is replaced by the branch it takes.

A function typed `x: Union[Tensor, List[Tensor]]` and called with a list (timm's DenseNet layers) keeps, once
inlined, `prim::isinstance[types=[Tensor]](%list)` and an If on it; the list's reads in that If kept its appends
from being functionalized, and every layer from an engine. The value's type decides where it is a subtype of a
checked type (True), or where it is concrete (no Union, Optional or Any inside) and a subtype of none (False: a
concrete value's run-time type is its static type). Anything else is left to the build-time evaluator or to run
time.
"""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.torchscript import Graph, inline_branch, value_key

_CONCRETE = ("TensorType", "IntType", "FloatType", "BoolType", "StringType", "NoneType", "DeviceObjType",
             "ListType", "TupleType", "DictType")


def _concrete(t: torch._C.JitType) -> bool:
    """Whether every value of type `t` has exactly that type at run time."""
    return t.kind() in _CONCRETE and all(_concrete(inner) for inner in t.containedTypes())


def _decided(node: torch._C.Node) -> bool | None:
    """The answer of a prim::isinstance node that its input's static type gives; None where it does not."""
    value_type = node.inputsAt(0).type()
    checked = node.tys("types")
    if any(value_type.isSubtypeOf(t) for t in checked):
        return True
    if _concrete(value_type):
        return False
    return None


def _fold(block: torch._C.Block, graph: Graph, answers: dict[int, bool]) -> bool:
    """Fold the block's decided checks, and the Ifs on them (`answers`: the constants made, by value key)."""
    changed = False
    pending = list(block.nodes())
    while pending:
        node = pending.pop(0)
        if node.kind() == "prim::If" and value_key(node.inputsAt(0)) in answers:
            answer = answers[value_key(node.inputsAt(0))]
            taken = list(list(node.blocks())[0 if answer else 1].nodes())
            inline_branch(node, answer)
            pending[:0] = taken  # now in this block
            continue
        for inner in node.blocks():
            changed |= _fold(inner, graph, answers)
        if node.kind() != "prim::isinstance" or (answer := _decided(node)) is None:
            continue
        constant = graph.insertConstant(answer)
        constant.node().moveBefore(node)
        node.output().replaceAllUsesWith(constant)
        node.destroy()
        answers[value_key(constant)] = answer
        changed = True
    return changed


@lowering_pass()
def fold_isinstance_by_type(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace isinstance checks that the checked value's static type decides by constants, and fold their Ifs."""
    return _fold(graph.block(), graph, {})
