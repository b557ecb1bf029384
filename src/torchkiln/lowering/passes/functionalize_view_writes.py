"""Functionalize View Writes: an in-place op into a slice of a fresh tensor (`y[:, 1:3] += 1`, `y[0] *= 2`,
`y[:, :k] = v`) becomes its functional op and a slice_scatter / select_scatter that makes the new tensor,
so the write converts instead of splitting the graph.

A write into a view must never change what anything reads, so the rewrite is made only where alias analysis
(analysis/resolve.py) shows every value sharing the memory: the base is new memory made in the graph's own
block (not a method input), its only aliases are slices and selections of it, the view written is read by
nothing after the write, and every other view of the base is made after it. Anything else stays as it is
(and partitioning keeps it in PyTorch).
"""
from __future__ import annotations

import logging

import torch

from torchkiln.analysis.resolve import alias_sources, alias_users
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.torchscript import Graph, Node, Value, node_key, node_schema, value_key

logger = logging.getLogger("torchkiln.lowering")

SCATTERS = {"aten::slice.Tensor": "aten::slice_scatter", "aten::select.int": "aten::select_scatter"}


def _writes_first_argument_only(node: Node) -> bool:
    try:
        schema = torch._C.parse_schema(node.schema())
    except RuntimeError:
        return False
    written = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
    return bool(written) and written[0] and not any(written[1:])


def _view_write(graph: Graph, writer: Node) -> tuple[list[Node], Value] | None:
    """(the chain of view nodes from the view written up to the base, the base) when `writer` is an in-place
    op into a view (a slice of a slice: `y[:, 1:3]`) that the rewrite may replace."""
    if not writer.kind().endswith("_") or not _writes_first_argument_only(writer):
        return None
    chain, value = [], writer.inputsAt(0)
    while node_key(value.node()) in SCATTERS and value.node().owningBlock() == graph.block():
        chain.append(value.node())
        value = value.node().inputsAt(0)
    base = value
    if not chain or base.node().kind() == "prim::Param" or alias_sources(base):
        return None  # not a view, a view of a method input (the caller's memory), or of something else
    if any(o.uses() for o in writer.outputs()) or any(u.user.isAfter(writer) for n in chain for u in n.output().uses()):
        return None  # the written view is read afterwards: it would have to see later writes too
    if any(u.user.owningBlock() != graph.block() for u in base.uses()):
        return None
    allowed = {value_key(v) for v in [base, *writer.outputs(), *(n.output() for n in chain)]}
    if any(value_key(v) not in allowed and not v.node().isAfter(writer) for v in _aliases(base)):
        return None  # an alias made before the write would still see the old memory
    return chain, base


def _aliases(base: Value) -> list[Value]:
    """Every value that may share memory with `base` (views, views of views, what holds them), with alias
    analysis's one-step walk (analysis/resolve.py)."""
    found, stack = {value_key(base): base}, [base]
    while stack:
        for v in alias_users(stack.pop())[0]:
            if value_key(v) not in found:
                found[value_key(v)] = v
                stack.append(v)
    return list(found.values())


def _functional(graph: Graph, writer: Node, view_value: Value) -> Value:
    """What the in-place op writes into the view, as a new tensor of the view's shape and dtype."""
    args = list(writer.inputs())
    if writer.kind() == "aten::copy_":
        value = graph.insert("aten::expand_as", [args[1], view_value])
    else:  # the functional overload of the same arguments (graph.insert could pick another one)
        node = graph.create(writer.kind()[:-1], args)
        node.output().setType(torch._C.TensorType.get())
        graph.insertNode(node)
        if node_schema(node) is None:
            node.destroy()
            raise RuntimeError(f"{writer.kind()[:-1]} has no overload for these arguments")
        value = node.output()
    return graph.insert("aten::type_as", [value, view_value])  # in place keeps the view's dtype


@lowering_pass(replaces=())
def functionalize_view_writes(graph: Graph, ctx: LoweringContext) -> bool:
    """Rewrite in-place ops into a slice or selection of a fresh tensor as scatters of the functional op."""
    rewrote, changed = False, True
    while changed:
        changed = False
        for writer in list(graph.nodes()):
            found = _view_write(graph, writer)
            if found is None:
                continue
            chain, base = found
            with graph.insert_point_guard(writer):
                try:
                    value = _functional(graph, writer, chain[0].output())
                except RuntimeError:  # no functional form with these arguments
                    continue
                for view in chain:  # the written view's new value, then its parent's, up to the base's
                    value = graph.insert(SCATTERS[node_key(view)], [view.inputsAt(0), value, *list(view.inputs())[1:]])
            for use in list(base.uses()):
                if use.user.isAfter(writer):
                    use.user.replaceInput(use.offset, value)
            logger.debug("%s into a view of %%%s rewritten as %s", writer.kind(), base.debugName(),
                         value.node().kind())
            writer.destroy()
            changed = rewrote = True
            break  # the alias facts changed: walk again
    return rewrote
