"""Reordering top-level nodes so that engine nodes run next to each other.

A node that does not depend on a PyTorch node may sit between two runs of engine nodes only because
the source was written in that order; moving it lets the two runs become one engine. The schedule is
a topological order of the top-level nodes in which

- every node comes after the nodes whose values it (or any node in its blocks) reads, and
- impure nodes are fences: a node that writes to its inputs (in-place ops, list appends), has no
  outputs (prints, raises, warnings), is nondeterministic (random ops) or has blocks holding such a
  node keeps its place relative to every other node. Pure nodes only move within the stretch between
  two fences, so no node moves across a mutation of a value it might alias, nor across a side effect.

Among those orders it greedily emits nodes of the current kind (engine or PyTorch) while any is ready;
static nodes (build-time values) are emitted as soon as they are ready, since they run nowhere. It
tries starting with either kind and keeps the order with the fewest engine runs (then PyTorch runs),
the original order winning ties. Structural nodes such as the `prim::ListConstruct` feeding an
`aten::cat` need no special care: the list is ready exactly when its consumer can run.
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


from torchkiln.partitioning.support import Target
from torchkiln.torchscript import Graph, Node, node_schema, used_values, writes_to_arguments

_PURE_PRIMS = frozenset({
    "prim::Constant", "prim::ListConstruct", "prim::TupleConstruct", "prim::DictConstruct", "prim::ListUnpack",
    "prim::TupleUnpack", "prim::TupleIndex", "prim::TupleSlice", "prim::GetAttr", "prim::NumToTensor",
    "prim::If", "prim::Loop", "prim::Uninitialized", "prim::unchecked_cast", "prim::ConstantChunk",
})


def is_pure(node: Node) -> bool:
    """Whether moving `node` among other pure nodes cannot change what the method computes."""
    if node.outputsSize() == 0 or node.isNondeterministic():
        return False
    if not all(is_pure(inner) for block in node.blocks() for inner in block.nodes()):
        return False
    schema = node_schema(node)
    return node.kind() in _PURE_PRIMS if schema is None else not writes_to_arguments(schema)


def dependencies(graph: Graph) -> dict[Node, set[Node]]:
    """For each top-level node, the top-level nodes that must run before it."""
    nodes = list(graph.nodes())
    members = set(nodes)
    deps: dict[Node, set[Node]] = {}
    fence: Node | None = None
    since_fence: list[Node] = []
    for node in nodes:
        before = {v.node() for v in used_values(node) if v.node() in members and v.node() is not node}
        if fence is not None:
            before.add(fence)
        if is_pure(node):
            since_fence.append(node)
        else:
            before.update(since_fence)
            fence, since_fence = node, []
        deps[node] = before
    return deps


def _greedy(nodes: Sequence[Node], deps: Mapping[Node, set[Node]], targets: Mapping[Node, Target],
            first: Target) -> list[Node]:
    position = {n: i for i, n in enumerate(nodes)}
    users: dict[Node, list[Node]] = {n: [] for n in nodes}
    waiting = {n: len(deps[n]) for n in nodes}
    for n in nodes:
        for d in deps[n]:
            users[d].append(n)
    ready: dict[Target, list[int]] = {t: [] for t in Target}
    for n in nodes:
        if not waiting[n]:
            heapq.heappush(ready[targets[n]], position[n])
    order: list[Node] = []
    mode = first
    while len(order) < len(nodes):
        if ready[Target.STATIC]:
            kind = Target.STATIC
        else:
            if not ready[mode]:
                mode = Target.TORCH if mode == Target.ENGINE else Target.ENGINE
            kind = mode
        node = nodes[heapq.heappop(ready[kind])]
        order.append(node)
        for u in users[node]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready[targets[u]], position[u])
    return order


def _runs(order: Sequence[Node], targets: Mapping[Node, Target]) -> tuple[int, int]:
    """(engine runs, PyTorch runs) of an order; static nodes join any run."""
    counts = {Target.ENGINE: 0, Target.TORCH: 0}
    last = None
    for n in order:
        t = targets[n]
        if t != Target.STATIC and t != last:
            counts[t] += 1
            last = t
    return counts[Target.ENGINE], counts[Target.TORCH]


def schedule(nodes: Sequence[Node], deps: Mapping[Node, set[Node]], targets: Mapping[Node, Target]) -> list[Node]:
    """The order of `nodes` (given in a valid order) with the fewest engine runs this heuristic finds."""
    candidates = [list(nodes)] + [_greedy(nodes, deps, targets, first) for first in (Target.ENGINE, Target.TORCH)]
    return min(candidates, key=lambda order: _runs(order, targets))


def apply_order(graph: Graph, order: Sequence[Node]) -> None:
    """Move the graph's top-level nodes into `order` (which holds each of them once)."""
    end = graph.return_node()
    for node in order:
        node.moveBefore(end)
