"""Segmentation: maximal runs of engine nodes become engine blocks, the rest torch blocks.

The top-level nodes are first put in a schedule (`schedule.py`) that brings engine nodes together
without moving any node across a dependency, a mutation or a side effect. Blocks are contiguous runs
of that order, so every block's inputs are defined before it and blocks cannot form a cycle. Static
nodes (build-time values) join whichever run they sit in; where a torch node reads one, it gets a
constant instead. Fixing boundaries and `min_block_size` move nodes to PyTorch, and the schedule is
redone until nothing moves; the graph is then reordered to the final schedule.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from torchkiln.analysis.registry import find_converter
from torchkiln.analysis.resolve import NotStatic, Resolver, is_dynamic
from torchkiln.partitioning.schedule import apply_order, dependencies, schedule
from torchkiln.partitioning.support import Decision, Fallback, Target, classify
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import (Graph, Node, TensorMeta, Value, is_tensor_type, node_blocks, outer_values,
                                   top_level_node, value_key)

logger = logging.getLogger("torchkiln.partitioning")


@dataclasses.dataclass
class Block:
    """A run of nodes. For engine blocks: tensor inputs and outputs in binding order, and the
    static values read outside the block (they become constants)."""

    target: Target
    nodes: list[Node]
    inputs: list[Value] = dataclasses.field(default_factory=list)
    outputs: list[Value] = dataclasses.field(default_factory=list)
    static_outputs: list[tuple[Value, Any]] = dataclasses.field(default_factory=list)

    @property
    def is_engine(self) -> bool:
        return self.target == Target.ENGINE


@dataclasses.dataclass
class Partition:
    """The graph's top-level nodes in their final order, where each runs, and the blocks."""

    graph: Graph
    nodes: list[Node]
    decisions: dict[Node, Decision]
    blocks: list[Block]
    metas: dict[int, TensorMeta]

    def decision(self, node: Node) -> Decision:
        return self.decisions[node]


class _PartitionResolver(Resolver):
    """Resolves with shape analysis' metadata; a tensor computed by a node that runs in PyTorch is a run-time
    tensor even when its node has an evaluator (e.g. `prim::TupleIndex` of a tuple argument)."""

    def __init__(self, metas: dict[int, TensorMeta]) -> None:
        super().__init__(metas)
        self.in_torch: set[Node] = set()

    def known(self, v: Value) -> tuple[bool, Any]:
        meta = self.metas.get(value_key(v))
        if meta is not None and v.node() in self.in_torch:
            return True, meta
        return False, None


def is_layer_op(node: Node, decision: Decision) -> bool:
    """An engine node that becomes layers (not a collection of engine tensors); what min_block_size counts."""
    return decision.target == Target.ENGINE and (find_converter(node) is not None or bool(node_blocks(node)))


def layer_ops(node: Node) -> int:
    """The ops a node converts to layers: one, or those inside an If's or Loop's blocks."""
    blocks = node_blocks(node)
    if not blocks:
        return int(find_converter(node) is not None)
    return sum(layer_ops(inner) for block in blocks for inner in block.nodes())


def _is_constant_value(value: Any) -> bool:
    """Whether graph.insertConstant can hold this static value."""
    if value is None or isinstance(value, (bool, int, float, str, torch.device, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value}
        return len(kinds) <= 1 and kinds <= {int, float, bool, torch.Tensor}
    return False


def _runs(decisions: list[Decision]) -> list[tuple[Target, list[int]]]:
    """Split node positions into engine runs (trimmed of static nodes at either end) and torch runs."""
    runs: list[tuple[Target, list[int]]] = []
    current: list[int] = []

    def close() -> None:
        first = next((k for k, i in enumerate(current) if decisions[i].target == Target.ENGINE), None)
        if first is None:
            _append(runs, Target.TORCH, current)
        else:
            last = max(k for k, i in enumerate(current) if decisions[i].target == Target.ENGINE)
            _append(runs, Target.TORCH, current[:first])
            _append(runs, Target.ENGINE, current[first:last + 1])
            _append(runs, Target.TORCH, current[last + 1:])
        current.clear()

    for i, d in enumerate(decisions):
        if d.target == Target.TORCH:
            close()
            _append(runs, Target.TORCH, [i])
        else:
            current.append(i)
    close()
    return runs


def _append(runs: list[tuple[Target, list[int]]], target: Target, indices: list[int]) -> None:
    if not indices:
        return
    if runs and runs[-1][0] == target == Target.TORCH:
        runs[-1][1].extend(indices)
    else:
        runs.append((target, list(indices)))


def _boundary(block: Block, decisions: dict[Node, Decision], resolver: Resolver) -> bool:
    """Fill the block's inputs and outputs; demote nodes that would pass non-tensors across. True if any was."""
    members = set(block.nodes)
    block_graph = block.nodes[0].owningBlock()
    demoted = False
    for node in block.nodes:
        target = decisions[node].target
        if target == Target.ENGINE:
            for v in [*node.inputs(), *outer_values(node)]:  # an If's or Loop's blocks read outer values too
                if v.node() in members or v in block.inputs:
                    continue
                try:
                    value = resolver.resolve(v)
                except NotStatic:
                    value = None
                    dynamic = True
                else:
                    dynamic = is_dynamic(value)
                if not dynamic:
                    continue
                if isinstance(value, TensorMeta) and is_tensor_type(v.type()):
                    block.inputs.append(v)
                else:
                    decisions[node] = Decision.torch(
                        Fallback.BOUNDARY, f"input %{v.debugName()} is a {v.type()} made outside the engine")
                    demoted = True
        for out in node.outputs():
            outside = [u for u in out.uses() if top_level_node(u.user, block_graph) not in members]
            if not outside:
                continue
            if target == Target.STATIC:
                value = resolver.resolve(out)
                if _is_constant_value(value):
                    block.static_outputs.append((out, value))
                    continue
            elif is_tensor_type(out.type()) and isinstance(resolver.resolve(out), TensorMeta):
                block.outputs.append(out)
                continue
            decisions[node] = Decision.torch(
                Fallback.BOUNDARY, f"output %{out.debugName()} ({out.type()}) is read outside the engine")
            demoted = True
    return demoted


def _blocks(order: list[Node], decisions: dict[Node, Decision], resolver: Resolver) -> tuple[list[Block], bool]:
    blocks, demoted = [], False
    for target, indices in _runs([decisions[n] for n in order]):
        block = Block(target, [order[i] for i in indices])
        if target == Target.ENGINE:
            demoted |= _boundary(block, decisions, resolver)
        blocks.append(block)
    return blocks, demoted


def _demote_small(blocks: list[Block], decisions: dict[Node, Decision], min_block_size: int) -> bool:
    """Send engine blocks of fewer than `min_block_size` layer ops back to PyTorch. True if any was."""
    small = False
    for block in blocks:
        ops = sum(layer_ops(n) for n in block.nodes if is_layer_op(n, decisions[n]))
        if block.is_engine and ops < min_block_size:
            for n in block.nodes:
                if decisions[n].target == Target.ENGINE:
                    decisions[n] = Decision.torch(
                        Fallback.MIN_BLOCK_SIZE, f"its engine block would hold {ops} op(s), fewer than "
                                                 f"min_block_size={min_block_size}")
            small = True
    return small


def partition(graph: Graph, metas: dict[int, TensorMeta], settings: CompileSettings,
              forced: Mapping[Node, Decision] | None = None) -> Partition:
    """Split the graph's top-level nodes into engine and torch blocks, reordering the graph to match.

    `forced` overrides the decision of some nodes (the compiler uses it for nodes whose conversion failed).
    With `require_full_compilation`, min_block_size does not apply: the whole method is wanted as one engine.
    """
    nodes = list(graph.nodes())
    resolver = _PartitionResolver(metas)
    forced = forced or {}
    decisions = {}
    for n in nodes:  # in graph order: a node's producers are decided before it
        decisions[n] = forced[n] if n in forced else classify(n, resolver, settings)
        if decisions[n].target == Target.TORCH:
            resolver.in_torch.add(n)
    deps = dependencies(graph)
    while True:
        order = schedule(nodes, deps, {n: d.target for n, d in decisions.items()})
        blocks, demoted = _blocks(order, decisions, resolver)
        if demoted:
            continue
        if settings.require_full_compilation or not _demote_small(blocks, decisions, settings.min_block_size):
            break
    apply_order(graph, order)
    logger.debug("partitioned into %s", [(b.target.value, len(b.nodes)) for b in blocks])
    return Partition(graph, order, decisions, blocks, metas)
