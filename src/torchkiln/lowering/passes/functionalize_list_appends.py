"""Functionalize list appends: later readers of a list read the append's result instead.

`l.append(x)` mutates `l`; TorchScript keeps reading `%l` afterwards, so its value depends on
where it is read. After this pass, `aten::append(%l, %x)`'s output (the same list at run time) is
what later nodes read (likewise `aten::_set_item.t`, `l[i] = x`), and `aten::extend(%l, %m)` becomes
`%l2 = aten::add(%l, %m)` read the same way. Build-time evaluation can then give every list value one
meaning (`append` copies). A dict's item sets (`d[k] = v`, which return nothing) that come before any
other use of a new dict are folded into a `prim::DictConstruct` placed after them.
Reads nested in later nodes' blocks (`if sum(shift_size) > 0: ... shift_size[0]`) are redirected too; lists and
dicts with uses in enclosing or sibling blocks, or that other values alias, are left alone; the resolver treats
those as run-time values.
"""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.torchscript import ALIASING_USERS, FRESH_LIST_PRODUCERS, Graph, Node, Value

_ELEMENTS = (torch._C.IntType, torch._C.FloatType, torch._C.BoolType, torch._C.StringType, torch._C.TensorType)


def _rewritable(lst: Value, node: Node) -> bool:
    """Straight-line uses of a list of immutable elements that no other value aliases."""
    if not isinstance(lst.type(), torch._C.ListType) or not isinstance(lst.type().getElementType(), _ELEMENTS):
        return False
    if lst.node().kind() not in FRESH_LIST_PRODUCERS:
        return False
    return all(_within(u.user, node.owningBlock()) and u.user.kind() not in ALIASING_USERS for u in lst.uses())


def _within(user: Node, block: torch._C.Block) -> bool:
    """Whether `user` sits in `block` or in a block nested in one of its nodes (a branch that reads the list)."""
    inner: torch._C.Block | None = user.owningBlock()
    while inner is not None and inner != block:
        owner = inner.owningNode()
        inner = owner.owningBlock() if owner is not None else None
    return inner is not None


def _read_later_from(lst: Value, node: Node, replacement: Value) -> None:
    for use in list(lst.uses()):
        if use.user is not node and use.user.isAfter(node):
            use.user.replaceInput(use.offset, replacement)


def _functionalize(graph: Graph, block: torch._C.Block) -> bool:
    changed = False
    for node in list(block.nodes()):
        for inner in node.blocks():
            changed |= _functionalize(graph, inner)
        if node.kind() not in ("aten::append", "aten::_set_item", "aten::extend") \
                or not _rewritable(node.inputsAt(0), node):
            continue
        lst = node.inputsAt(0)
        later = [u for u in lst.uses() if u.user is not node and u.user.isAfter(node)]
        if node.kind() != "aten::extend":
            if later:
                _read_later_from(lst, node, node.output())
                changed = True
            continue
        with graph.insert_point_guard(node):
            joined = graph.insertNode(graph.create("aten::add", [lst, node.inputsAt(1)]))
            joined.output().setType(lst.type())
        _read_later_from(lst, node, joined.output())
        node.destroy()
        changed = True
    return changed


def _fold_item_sets(graph: Graph, construct: Node) -> bool:
    """`d = {...}; d[k] = v; ...` -> one DictConstruct after the item sets that precede every other use of `d`
    in its block (later sets win, as in a dict literal)."""
    d = construct.output()
    uses = [u.user for u in d.uses()]
    if any(u.owningBlock() != construct.owningBlock() for u in uses):
        return False
    sets = []
    for user in _in_order(uses):
        if user.kind() != "aten::_set_item" or user.inputsAt(0).unique() != d.unique():
            break
        sets.append(user)
    if not sets:
        return False
    pairs = list(construct.inputs()) + [v for s in sets for v in (s.inputsAt(1), s.inputsAt(2))]
    with graph.insert_point_guard(sets[-1]):
        rebuilt = graph.insertNode(graph.create("prim::DictConstruct", pairs))
    rebuilt.moveAfter(sets[-1])
    rebuilt.output().setType(d.type())
    d.replaceAllUsesWith(rebuilt.output())
    for s in sets:
        s.destroy()
    construct.destroy()
    return True


def _in_order(nodes: list[Node]) -> list[Node]:
    """Nodes of one block in program order."""
    ordered: list[Node] = []
    for n in nodes:
        i = 0
        while i < len(ordered) and ordered[i].isBefore(n):
            i += 1
        ordered.insert(i, n)
    return ordered


@lowering_pass()
def functionalize_list_appends(graph: Graph, ctx: LoweringContext) -> bool:
    """Make later readers of an appended, extended or item-set list (or dict) read a new value, not the mutated one."""
    changed = False
    for construct in graph.findAllNodes("prim::DictConstruct"):
        changed |= _fold_item_sets(graph, construct)
    return _functionalize(graph, graph.block()) or changed
