"""Inline Attributes: attribute reads freezing left in the graph (Optional[Tensor] attributes such as
nn.MultiheadAttention's in_proj_weight) become constants, when the method writes no attribute. A tensor attribute
that the method writes in place (through any read of it, or a view of one) stays an attribute read: it is the
module's state, which every call must see as the last call left it."""
from __future__ import annotations

import torch

from torchkiln.analysis.resolve import Resolver
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph

_CONSTANT_TYPES = (torch.Tensor, bool, int, float, str, type(None))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@lowering_pass()
def inline_attributes(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace prim::GetAttr chains from `self` that end in a tensor, number, string or None by constants."""
    if ctx.module is None or any(n.kind() == "prim::SetAttr" for n in all_nodes(graph.block())):
        return False
    owner = {next(graph.inputs()).unique(): ctx.module}  # value -> the module object it holds
    reads = []
    for node in list(all_nodes(graph.block())):
        if node.kind() != "prim::GetAttr" or node.inputsAt(0).unique() not in owner:
            continue
        value = getattr(owner[node.inputsAt(0).unique()], node.s("name"))
        if isinstance(value, (torch.jit.ScriptModule, torch._C.ScriptModule)):
            owner[node.output().unique()] = value
        elif isinstance(value, _CONSTANT_TYPES):
            reads.append((node, value))
    aliases = Resolver({})
    written = {_storage(v) for n, v in reads if isinstance(v, torch.Tensor) and aliases.written(n.output())}
    changed = False
    for node, value in reads:
        if isinstance(value, torch.Tensor) and _storage(value) in written:
            continue
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(value.detach() if isinstance(value, torch.Tensor) else value)
        node.output().replaceAllUsesWith(constant)
        node.destroy()
        changed = True
    torch._C._jit_pass_dce(graph)
    return changed
