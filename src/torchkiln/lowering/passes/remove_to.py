"""Remove To: drop casts that change nothing (same dtype, same device, no copy) and memory-format-only casts.

A cast that changes the dtype stays: the converters see it. Runs late, after CSE has merged every
prim::dtype(x) of one x, so `x.to(x.dtype)` is recognisable.
"""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph, Node, Value, argument_names, node_key

# Overload -> (arguments that must be x's own dtype or None, ... device or None, ... None).
# `copy`, where the overload has it, must be the constant False; the memory format may be anything.
_NOOP_WHEN = {
    "aten::to.dtype": (("dtype",), (), ()),
    "aten::to.device": (("dtype",), ("device",), ()),
    "aten::to.other": ((), (), ()),
    "aten::to.dtype_layout": (("dtype",), ("device",), ("layout", "pin_memory")),
    "aten::to.prim_Device": (("dtype",), ("device",), ()),
    "aten::to.prim_dtype": (("dtype",), (), ()),
    "aten::to.prim_other": ((), (), ()),
}


def _constant(v: Value, expected: object) -> bool:
    return v.node().kind() == "prim::Constant" and v.toIValue() == expected


def _none_or_own(v: Value, x: Value, prop: str) -> bool:
    """v is None or prop(x): prim::dtype / prim::device of the cast tensor itself."""
    return _constant(v, None) or (v.node().kind() == prop and v.node().inputsAt(0) == x)


def _is_noop(node: Node) -> bool:
    key = node_key(node)
    if key == "aten::type_as":
        return node.inputsAt(1) == node.inputsAt(0)
    if key not in _NOOP_WHEN:
        return False
    args = dict(zip(argument_names(node), node.inputs()))
    x = args["self"]
    if "copy" in args and not _constant(args["copy"], False):
        return False
    if "other" in args and args["other"] != x:
        return False
    dtypes, devices, nones = _NOOP_WHEN[key]
    return (all(_none_or_own(args[n], x, "prim::dtype") for n in dtypes)
            and all(_none_or_own(args[n], x, "prim::device") for n in devices)
            and all(_constant(args[n], None) for n in nones))


@lowering_pass(replaces=("aten::to", "aten::type_as"))
def remove_to(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace x.to(...) and x.type_as(x) by x where they keep x's dtype and device and make no copy."""
    noops = [n for n in all_nodes(graph.block()) if n.kind() in ("aten::to", "aten::type_as") and _is_noop(n)]
    for node in noops:
        node.output().replaceAllUsesWith(node.inputsAt(0))
        node.destroy()
    return bool(noops)
