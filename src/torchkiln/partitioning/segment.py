"""Segmentation: maximal runs of engine nodes become engine blocks, the rest torch blocks.

Blocks are contiguous in the graph's node order, so every block's inputs are defined before it
and no reordering can create a cycle. Static nodes (build-time values) join whichever run they sit
in; where a torch node reads one, it gets a constant instead.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from torchkiln.conversion.resolve import NotStatic, Resolver, is_dynamic
from torchkiln.partitioning.support import Decision, Fallback, Target, classify
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph, Node, TensorMeta, Value, is_tensor_type, top_level_node

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
    graph: Graph
    nodes: list[Node]
    decisions: list[Decision]
    blocks: list[Block]
    metas: dict[int, TensorMeta]

    def decision(self, node: Node) -> Decision:
        return self.decisions[self.nodes.index(node)]


def _is_constant_value(value: Any) -> bool:
    """Whether graph.insertConstant can hold this static value."""
    if value is None or isinstance(value, (bool, int, float, str, torch.device, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value}
        return len(kinds) <= 1 and kinds <= {int, float, bool, torch.Tensor}
    return False


def _runs(nodes: list[Node], decisions: list[Decision]) -> list[tuple[Target, list[int]]]:
    """Split node indices into engine runs (trimmed of static nodes at either end) and torch runs."""
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


def _boundary(block: Block, members: set[Node], decisions: list[Decision], index: dict[Node, int],
              resolver: Resolver) -> bool:
    """Fill the block's inputs and outputs; demote nodes that would pass non-tensors across. True if any was."""
    block_graph = block.nodes[0].owningBlock()
    demoted = False
    for node in block.nodes:
        target = decisions[index[node]].target
        if target == Target.ENGINE:
            for v in node.inputs():
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
                    decisions[index[node]] = Decision.torch(
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
            decisions[index[node]] = Decision.torch(
                Fallback.BOUNDARY, f"output %{out.debugName()} ({out.type()}) is read outside the engine")
            demoted = True
    return demoted


def _blocks(nodes: list[Node], decisions: list[Decision], index: dict[Node, int],
            resolver: Resolver) -> tuple[list[Block], bool]:
    blocks, demoted = [], False
    for target, indices in _runs(nodes, decisions):
        block = Block(target, [nodes[i] for i in indices])
        if target == Target.ENGINE:
            demoted |= _boundary(block, set(block.nodes), decisions, index, resolver)
        blocks.append(block)
    return blocks, demoted


def partition(graph: Graph, metas: dict[int, TensorMeta], settings: CompileSettings) -> Partition:
    """Split the graph's top-level nodes into engine and torch blocks."""
    nodes = list(graph.nodes())
    index = {n: i for i, n in enumerate(nodes)}
    resolver = Resolver(metas)
    decisions = [classify(n, resolver, settings) for n in nodes]
    blocks, demoted = _blocks(nodes, decisions, index, resolver)
    while demoted:
        blocks, demoted = _blocks(nodes, decisions, index, resolver)
    small = False
    for block in blocks:
        converted = [n for n in block.nodes if decisions[index[n]].target == Target.ENGINE]
        if block.is_engine and len(converted) < settings.min_block_size:
            for n in converted:
                decisions[index[n]] = Decision.torch(
                    Fallback.MIN_BLOCK_SIZE, f"block of {len(converted)} < min_block_size {settings.min_block_size}")
            small = True
    if small:
        blocks, demoted = _blocks(nodes, decisions, index, resolver)
        assert not demoted, "demoting small blocks cannot change other blocks' boundaries"
    logger.debug("partitioned into %s", [(b.target.value, len(b.nodes)) for b in blocks])
    return Partition(graph, nodes, decisions, blocks, metas)
