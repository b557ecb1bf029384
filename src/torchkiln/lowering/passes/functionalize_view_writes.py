"""Functionalize View Writes: an in-place op into a slice of a fresh tensor (`y[:, 1:3] += 1`, `y[0] *= 2`,
`y[:, :k] = v`) becomes its functional op and a slice_scatter / select_scatter that makes the new tensor,
so the write converts instead of splitting the graph.

A write into a view must never change what anything reads, so the rewrite is made only where alias analysis
(analysis/resolve.py) shows every value sharing the memory: the base is new memory that an op with a schema
makes in the graph's own block (not a method input, a constant or a module attribute, whose memory outlives
the call), its only aliases are slices and selections of it, and every other view of the base is made after
the write or read nowhere after it (a trace writes `x[i] += v` as `x[i].add_(v)`, then copies that view into a
new `x[i]`). Later reads of the base read the scatter's result. Where the view written (or a view it was sliced
from) is read after the write too (timm's GhostNet returns `x += shortcut` on a slice of a fresh cat), those
reads read the functional op's result instead, which needs one more fact: nothing writes into that memory
after this write, which the old view would see and the new value would not.

Three more cases need no scatter, because nothing can tell whether memory was shared:
- a write into any view (reshapes, permutes, slices: transformers' Funnel shifts its scores with two reshapes and
  then writes `positional_attn *= cls_mask`) of new memory that nothing but the write's own result reads after
  the write becomes the functional op;
- so does a write into new memory itself that views are made of, where every view read after the write is made
  after it, and later reads of that memory read the op's result (Res2Net's blocks in DLA: `out = relu_(conv(x))`,
  then `torch.split(out)`, its pieces put in a list with other tensors): partitioning's alias check does not order
  a write before the views, and kept the write, the split and its readers in PyTorch;
- `contiguous(x)` (a copy, or `x` itself) that is written in place afterwards becomes `clone(x)` when nothing but
  the contiguous result reads x's memory after it (BEiT writes its permuted coordinate table this way).
Anything else stays as it is (and partitioning keeps it in PyTorch).
"""
from __future__ import annotations

import logging

import torch

from torchkiln.analysis.resolve import alias_sources, aliases_of, writers_into
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.torchscript import Graph, Node, Value, holds_tensor_type, is_tensor_type, node_key, node_schema, \
    value_key

logger = logging.getLogger("torchkiln.lowering")

SCATTERS = {"aten::slice.Tensor": "aten::slice_scatter", "aten::select.int": "aten::select_scatter"}
_NOT_NEW = ("prim::Param", "prim::Constant", "prim::GetAttr")  # the caller's or the module's memory
_CONTAINERS = (torch._C.ListType, torch._C.DictType, torch._C.TupleType)
_PASSING = ("prim::If", "prim::Loop", "prim::Param")  # a block's or a control node's output: the value passed on


def _writes_first_argument_only(node: Node) -> bool:
    try:
        schema = torch._C.parse_schema(node.schema())
    except RuntimeError:
        return False
    written = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
    return bool(written) and written[0] and not any(written[1:])


def _made_here(base: Value) -> bool:
    """Whether `base` is new memory that lives only in this call: made by an op whose schema says its result
    aliases none of its arguments."""
    node = base.node()
    return node.kind() not in _NOT_NEW and node_schema(node) is not None and not alias_sources(base)


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
    if not chain or not _made_here(base):
        return None  # not a view, or a view of memory that outlives the call (or of something else)
    if any(u.user.owningBlock() != graph.block() for u in base.uses()):
        return None
    views = [*writer.outputs(), *(n.output() for n in chain)]
    allowed = {value_key(v) for v in [base, *views]}
    aliases = aliases_of(base)
    if any(u.user.kind() == "prim::SetAttr" for v in aliases for u in v.uses()):
        return None  # stored in a module attribute: read through it, it would still see the old memory
    if any(value_key(v) not in allowed and not v.node().isAfter(writer) and _used_after(graph, v, writer)
           for v in aliases):
        return None  # an alias made before the write and read after it would still see the old memory
    if _read_after(views, writer) and any(w is not writer and w.isAfter(writer) for w in writers_into(aliases)):
        return None  # the view read afterwards would have to see the later write too
    return chain, base


def _private_root(graph: Graph, value: Value) -> Value | None:
    """The new memory made in the method that `value` is (a view of), through views of one base each; None when
    it may be memory that outlives the call, or view several."""
    while True:
        if value.node().owningBlock() != graph.block():
            return None
        sources = alias_sources(value)
        if not sources:
            return value if _made_here(value) else None
        if len(sources) != 1:
            return None
        value = sources[0]


def _unread_after(graph: Graph, root: Value, node: Node, keep: Value) -> bool:
    """Whether no value sharing `root`'s memory, except `keep` and what is made from it, is read after `node`
    (nor read inside a nested block, nor stored in a module attribute)."""
    kept = {value_key(v) for v in aliases_of(keep)}
    for v in aliases_of(root):
        if value_key(v) in kept:
            continue
        if _used_after(graph, v, node) or any(u.user.kind() == "prim::SetAttr" for u in v.uses()):
            return False
    return True


def _dead_view_write(graph: Graph, writer: Node) -> bool:
    """Whether `writer` writes in place into a view of new memory that nothing but its result reads afterwards,
    so that its functional op computes the same."""
    if not writer.kind().endswith("_") or not _writes_first_argument_only(writer) or writer.outputsSize() != 1:
        return False
    view = writer.inputsAt(0)
    root = _private_root(graph, view) if alias_sources(view) else None  # new memory itself: the converters' case
    if root is None:
        return False
    shared = {value_key(v) for v in aliases_of(root)} - {value_key(view)}
    if any(value_key(v) in shared for v in list(writer.inputs())[1:]):
        return False  # reads the memory it writes through another view
    return _unread_after(graph, root, writer, writer.output())


def _written_before_its_views(graph: Graph, writer: Node) -> bool:
    """Whether `writer` writes in place into new memory itself (not a view) that views are made of, where every
    view read after the write is made after it: the functional op then computes the same, with later reads of the
    memory (`root` itself, the write's result) reading its result. Without views the converters take the write
    as it is."""
    if not writer.kind().endswith("_") or not _writes_first_argument_only(writer) or writer.outputsSize() != 1:
        return False
    root = writer.inputsAt(0)
    # (an op reading a container may return what the container holds: a dict's getter carries no alias annotation)
    if alias_sources(root) or not _made_here(root) or root.node().owningBlock() != graph.block() or \
            any(isinstance(i.type(), _CONTAINERS) and holds_tensor_type(i.type()) for i in root.node().inputs()) or \
            any(u.user.owningBlock() != graph.block() for u in root.uses()) or \
            any(value_key(v) == value_key(root) for v in list(writer.inputs())[1:]):
        return False
    aliases = aliases_of(root)
    writers = set(writers_into(aliases))  # (their results, and an If's or a Loop's passing them on, are no views)
    if not any(is_tensor_type(v.type()) and alias_sources(v) and v.node() not in writers and
               v.node().kind() not in _PASSING for v in aliases) or \
            any(u.user.kind() == "prim::SetAttr" for v in aliases for u in v.uses()):
        return False  # no views (the converters' case), or stored in a module attribute
    same = {value_key(root), value_key(writer.output())}
    return not any(value_key(v) not in same and not v.node().isAfter(writer) and _used_after(graph, v, writer)
                   for v in aliases)  # (a view made before the write and read after it would see the old values)


def _contiguous_copy(graph: Graph, node: Node) -> bool:
    """Whether `node` is `contiguous(x)` whose result is written in place, where nothing but that result reads
    x's memory after it: a copy then computes the same as the view contiguous may return."""
    if node_key(node) != "aten::contiguous" or not writers_into(aliases_of(node.output())):
        return False
    root = _private_root(graph, node.inputsAt(0))
    return root is not None and _unread_after(graph, root, node, node.output())


def _used_after(graph: Graph, value: Value, node: Node) -> bool:
    return any(u.user.owningBlock() != graph.block() or u.user.isAfter(node) for u in value.uses())


def _read_after(values: list[Value], node: Node) -> bool:
    return any(u.user.isAfter(node) for v in values for u in v.uses())


def _functional(graph: Graph, writer: Node, view_value: Value) -> Value:
    """What the in-place op writes into the view, as a new tensor of the view's shape and dtype."""
    args = list(writer.inputs())
    if writer.kind() == "aten::copy_":  # a copy: the source may be written later, the view must not see that
        value = graph.insert("aten::clone", [args[1]])
    else:  # the functional overload of the same arguments (graph.insert could pick another one)
        node = graph.create(writer.kind()[:-1], args)
        node.output().setType(torch._C.TensorType.get())
        graph.insertNode(node)
        if node_schema(node) is None or alias_sources(node.output()):
            node.destroy()  # no functional form, or a view (unsqueeze_, t_ change the view's shape, not its data)
            raise RuntimeError(f"{writer.kind()[:-1]} has no overload for these arguments that makes new memory")
        value = node.output()
    # in place keeps the view's shape (an operand broadcast past it raises, as in place does) and dtype
    value = graph.insert("aten::expand_as", [value, view_value])
    return graph.insert("aten::type_as", [value, view_value])


def _read_later_from(old: Value, new: Value, writer: Node) -> None:
    for use in list(old.uses()):
        if use.user.isAfter(writer):
            use.user.replaceInput(use.offset, new)


@lowering_pass(replaces=())
def functionalize_view_writes(graph: Graph, ctx: LoweringContext) -> bool:
    """Rewrite in-place ops into a slice or selection of a fresh tensor as scatters of the functional op."""
    rewrote, changed = False, True
    while changed:
        changed = False
        for writer in list(graph.nodes()):
            if _contiguous_copy(graph, writer):
                copy = graph.create("aten::clone", list(writer.inputs()))  # the same memory format
                copy.output().setType(writer.output().type())
                copy.insertBefore(writer)
                writer.output().replaceAllUsesWith(copy.output())
                writer.destroy()
                changed = rewrote = True
                break
            found = _view_write(graph, writer)
            fresh = found is None and _written_before_its_views(graph, writer)
            if found is None and (fresh or _dead_view_write(graph, writer)):
                with graph.insert_point_guard(writer):
                    try:
                        value = _functional(graph, writer, writer.inputsAt(0))
                    except RuntimeError:
                        continue
                writer.output().replaceAllUsesWith(value)
                if fresh:
                    _read_later_from(writer.inputsAt(0), value, writer)
                logger.debug("%s into %s rewritten as its functional op", writer.kind(),
                             "new memory, before views of it," if fresh else "a view of memory nothing reads again")
                writer.destroy()
                changed = rewrote = True
                break
            if found is None:
                continue
            chain, base = found
            with graph.insert_point_guard(writer):
                try:
                    value = _functional(graph, writer, chain[0].output())
                except RuntimeError:  # no functional form with these arguments that makes new memory
                    continue
                for out in writer.outputs():
                    _read_later_from(out, value, writer)
                for view in chain:  # the written view's new value, then its parent's, up to the base's
                    _read_later_from(view.output(), value, writer)
                    value = graph.insert(SCATTERS[node_key(view)], [view.inputsAt(0), value, *list(view.inputs())[1:]])
            _read_later_from(base, value, writer)
            logger.debug("%s into a view of %%%s rewritten as %s", writer.kind(), base.debugName(),
                         value.node().kind())
            writer.destroy()
            changed = rewrote = True
            break  # the alias facts changed: walk again
    return rewrote
