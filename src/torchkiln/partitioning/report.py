"""The partition report: each block, its ops and boundary shapes, and why ops stayed in PyTorch."""
from __future__ import annotations

import dataclasses

from torchkiln.partitioning.segment import Partition
from torchkiln.partitioning.support import Target, is_io_plumbing
from torchkiln.torchscript import Node, TensorMeta, Value, node_key, source_location, top_level_node, value_key


@dataclasses.dataclass(frozen=True)
class FallbackOp:
    """An op left in PyTorch and the reason."""

    op: str
    reason: str
    detail: str
    location: str


@dataclasses.dataclass(frozen=True)
class BlockReport:
    index: int
    target: str  # "engine" or "torch"
    ops: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...] | None, ...]  # None: not a tensor
    output_shapes: tuple[tuple[int, ...] | None, ...]
    fallback: tuple[FallbackOp, ...]


@dataclasses.dataclass(frozen=True)
class PartitionReport:
    blocks: tuple[BlockReport, ...]

    @property
    def num_engine_blocks(self) -> int:
        return sum(b.target == "engine" for b in self.blocks)

    @property
    def num_torch_blocks(self) -> int:
        return sum(b.target == "torch" for b in self.blocks)

    @property
    def fallback_ops(self) -> dict[str, int]:
        """Op -> how many of its nodes stay in PyTorch."""
        counts: dict[str, int] = {}
        for b in self.blocks:
            for f in b.fallback:
                counts[f.op] = counts.get(f.op, 0) + 1
        return counts

    def __str__(self) -> str:
        lines = [f"{self.num_engine_blocks} engine block(s), {self.num_torch_blocks} torch block(s)"]
        for b in self.blocks:
            ins = ", ".join("?" if s is None else "x".join(map(str, s)) or "scalar" for s in b.input_shapes)
            outs = ", ".join("?" if s is None else "x".join(map(str, s)) or "scalar" for s in b.output_shapes)
            lines.append(f"[{b.index}] {b.target:6} {len(b.ops)} ops  in: ({ins})  out: ({outs})")
            lines.append("      ops: " + ", ".join(b.ops))
            for f in b.fallback:
                detail = f" ({f.detail})" if f.detail and f.detail != f.op else ""
                lines.append(f"      - {f.op} at {f.location}: {f.reason}{detail}")
        return "\n".join(lines)


def _shape(part: Partition, v: Value) -> tuple[int, ...] | None:
    meta = part.metas.get(value_key(v))
    return meta.shape if isinstance(meta, TensorMeta) else None


def _torch_boundary(part: Partition, nodes: list[Node]) -> tuple[list[Value], list[Value]]:
    members = set(nodes)
    block = part.graph.block()
    ins: list[Value] = []
    outs: list[Value] = []
    for node in nodes:
        for v in node.inputs():
            if v.node() not in members and v.node().kind() != "prim::Constant" and v not in ins:
                ins.append(v)
        for o in node.outputs():
            if any(top_level_node(u.user, block) not in members for u in o.uses()):
                outs.append(o)
    return ins, outs


def make_report(part: Partition) -> PartitionReport:
    reports = []
    for i, block in enumerate(part.blocks):
        decisions = [part.decision(n) for n in block.nodes]
        if block.is_engine:
            ops = tuple(node_key(n) for n, d in zip(block.nodes, decisions) if d.target == Target.ENGINE)
            ins, outs, fallback = block.inputs, block.outputs, ()
        else:
            torch_nodes = [(n, d) for n, d in zip(block.nodes, decisions)
                           if d.target == Target.TORCH and not is_io_plumbing(n)]
            ops = tuple(node_key(n) for n, _ in torch_nodes)
            ins, outs = _torch_boundary(part, block.nodes)
            fallback = tuple(FallbackOp(node_key(n), d.reason.value, d.detail, source_location(n))
                             for n, d in torch_nodes)
        if not ops:
            continue
        reports.append(BlockReport(len(reports), "engine" if block.is_engine else "torch", ops,
                                   tuple(_shape(part, v) for v in ins), tuple(_shape(part, v) for v in outs),
                                   fallback))
    return PartitionReport(tuple(reports))
