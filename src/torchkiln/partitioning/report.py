"""The partition report: each block, its ops and boundary values, and why ops stayed in PyTorch.

`str(report)` is for people (the DEBUG log of `compile`); the dataclasses, or `report.as_dict()`
(plain JSON-able data), are for code.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any

import torch

from torchkiln.ir.symbolic import is_symbolic, ranges_str, shape_str, symbols_of
from torchkiln.partitioning.segment import Block, Partition, is_layer_op
from torchkiln.partitioning.support import Fallback, Target, is_io_plumbing
from torchkiln.torchscript import (TensorMeta, Value, binding_name, node_key, source_location, top_level_node,
                                   used_values, value_key)

_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "bool"}

_DTYPES = {str(d): d for d in _DTYPE_NAMES}  # as `as_dict` writes them


@dataclasses.dataclass(frozen=True)
class BoundaryValue:
    """A value crossing a block boundary: a tensor (shape and dtype from shape analysis) or another type."""

    name: str
    type: str  # "Tensor", or the TorchScript type: "int", "bool", "int[]"...
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.name}: {self.type}"
        dtype = _DTYPE_NAMES.get(self.dtype, str(self.dtype).removeprefix("torch."))
        return f"{self.name}: {dtype}[{shape_str(self.shape)}]"


@dataclasses.dataclass(frozen=True)
class FallbackOp:
    """An op left in PyTorch, the reason (a `Fallback`, equal to its text) and details."""

    op: str
    reason: Fallback
    detail: str
    location: str

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail and self.detail != self.op else ""
        return f"{self.op} at {os.path.basename(self.location)} -- {self.reason.value}{detail}"


@dataclasses.dataclass(frozen=True)
class BlockReport:
    index: int
    target: str  # "engine" or "torch"
    ops: tuple[str, ...]  # engine: the ops converted to layers; torch: the ops left in PyTorch
    inputs: tuple[BoundaryValue, ...]
    outputs: tuple[BoundaryValue, ...]
    fallback: tuple[FallbackOp, ...]  # torch blocks: one per op, in order

    @property
    def input_shapes(self) -> tuple[tuple[int, ...] | None, ...]:
        """Shapes of the inputs; None for a non-tensor."""
        return tuple(v.shape for v in self.inputs)

    @property
    def output_shapes(self) -> tuple[tuple[int, ...] | None, ...]:
        return tuple(v.shape for v in self.outputs)


@dataclasses.dataclass(frozen=True)
class ReferenceLayer:
    """A layer of an onnxruntime engine that runs on the reference backend inside it, and why."""

    engine: str
    layer: str
    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} layer {self.layer!r} of engine {self.engine!r}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Fp32Layer:
    """A layer that calibration kept in float, and why: in an fp16/bf16 engine, in fp32; in a quantized engine, in
    its float precision (with its measured quantization error)."""

    engine: str
    layer: str
    kind: str
    node: str  # the TorchScript node it came from and its source line
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} layer {self.layer!r} of engine {self.engine!r} ({self.node}): {self.reason}"


@dataclasses.dataclass(frozen=True)
class PartitionReport:
    """How a method was split: blocks in execution order (blocks holding only plumbing are left out).

    `reference_layers` (filled by `compile`, after the engines are built) lists the layers that engines on
    the onnxruntime backend run on the reference meanings, with the reason; `fp32_layers` the layers of fp16
    and bf16 engines that precision calibration kept in fp32, with the reason."""

    blocks: tuple[BlockReport, ...]
    name: str = ""
    reference_layers: tuple[ReferenceLayer, ...] = ()
    fp32_layers: tuple[Fp32Layer, ...] = ()

    @property
    def num_engine_blocks(self) -> int:
        return sum(b.target == "engine" for b in self.blocks)

    @property
    def num_torch_blocks(self) -> int:
        return sum(b.target == "torch" for b in self.blocks)

    @property
    def fallback_ops(self) -> dict[str, int]:
        """Op -> how many of its nodes stay in PyTorch."""
        return dict(collections.Counter(f.op for b in self.blocks for f in b.fallback))

    @property
    def fallback_reasons(self) -> dict[Fallback, int]:
        """Reason -> how many nodes stay in PyTorch for it."""
        return dict(collections.Counter(f.reason for b in self.blocks for f in b.fallback))

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (str, int, list, dict, None), e.g. for json.dumps."""
        def plain(obj: Any) -> Any:  # not dataclasses.asdict, which deep-copies symbolic dims (sympy refuses)
            if isinstance(obj, (torch.dtype, Fallback)) or is_symbolic(obj):
                return str(obj)
            if dataclasses.is_dataclass(obj):
                return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
            if isinstance(obj, (list, tuple)):
                return [plain(o) for o in obj]
            if isinstance(obj, dict):
                return {k: plain(v) for k, v in obj.items()}
            return obj

        return plain({"name": self.name, "num_engine_blocks": self.num_engine_blocks,
                      "num_torch_blocks": self.num_torch_blocks, "blocks": self.blocks,
                      "reference_layers": self.reference_layers, "fp32_layers": self.fp32_layers})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PartitionReport:
        """The report `as_dict` gave, where its shapes were static (ValueError otherwise, or for other data)."""
        def value(v: dict[str, Any]) -> BoundaryValue:
            shape = v["shape"]
            if shape is not None and not all(type(d) is int for d in shape):
                raise ValueError(f"a report with a dynamic shape ({shape}) cannot be read back")
            dtype = None if v["dtype"] is None else _DTYPES[v["dtype"]]
            return BoundaryValue(v["name"], v["type"], None if shape is None else tuple(shape), dtype)

        try:
            blocks = tuple(BlockReport(b["index"], b["target"], tuple(b["ops"]), tuple(map(value, b["inputs"])),
                                       tuple(map(value, b["outputs"])),
                                       tuple(FallbackOp(f["op"], Fallback(f["reason"]), f["detail"], f["location"])
                                             for f in b["fallback"])) for b in data["blocks"])
            return cls(blocks, data["name"], tuple(ReferenceLayer(**r) for r in data["reference_layers"]),
                       tuple(Fp32Layer(**r) for r in data["fp32_layers"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a partition report: {e!r}") from None

    def __str__(self) -> str:
        engine_ops = sum(len(b.ops) for b in self.blocks if b.target == "engine")
        total = sum(len(b.ops) for b in self.blocks)
        title = f"partition of {self.name}" if self.name else "partition"
        lines = [f"{title}: {_count(self.num_engine_blocks, 'engine block')}, "
                 f"{_count(self.num_torch_blocks, 'torch block')}; {engine_ops} of {total} ops in engines"]
        for b in self.blocks:
            ins = ", ".join(map(str, b.inputs))
            outs = ", ".join(map(str, b.outputs))
            lines.append(f"[{b.index}] {b.target:6} {_count(len(b.ops), 'op'):7}  ({ins}) -> ({outs})")
            if b.target == "engine":
                lines.append("      " + _summary(b.ops))
            for f in b.fallback:
                lines.append(f"      {f}")
        symbols = symbols_of([v.shape for b in self.blocks for v in b.inputs + b.outputs if v.shape is not None])
        if symbols:
            lines.append("dynamic dims: " + ranges_str(symbols))
        if self.fallback_ops:
            lines.append("left in PyTorch: " + ", ".join(f"{op} x{n}" for op, n in self.fallback_ops.items()))
        if self.reference_layers:
            lines.append(f"run on the reference backend inside ONNX Runtime engines: "
                         f"{_count(len(self.reference_layers), 'layer')}")
            lines += [f"      {r}" for r in self.reference_layers]
        if self.fp32_layers:
            lines.append(f"kept in float32 by precision calibration: {_count(len(self.fp32_layers), 'layer')}")
            lines += [f"      {r}" for r in self.fp32_layers]
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _summary(ops: tuple[str, ...]) -> str:
    counts = collections.Counter(ops)
    return ", ".join(op if counts[op] == 1 else f"{op} x{counts[op]}" for op in dict.fromkeys(ops))


def _name(v: Value) -> str:
    """A value's name; a part of a collection argument is named by its path, e.g. x[0] or d['u']."""
    producer = v.node()
    if producer.kind() in ("prim::TupleUnpack", "prim::ListUnpack", "prim::TupleIndex", "aten::__getitem__") \
            and is_io_plumbing(producer):
        source = producer.inputsAt(0)
        if producer.kind() in ("prim::TupleUnpack", "prim::ListUnpack"):
            return f"{_name(source)}[{v.offset()}]"
        index = producer.inputsAt(1)
        if index.node().kind() == "prim::Constant":
            return f"{_name(source)}[{index.toIValue()!r}]"
    return binding_name(v)


def _value(part: Partition, v: Value) -> BoundaryValue:
    meta = part.metas.get(value_key(v))
    if not isinstance(meta, TensorMeta):  # not a tensor, or a list of tensors
        return BoundaryValue(_name(v), str(v.type()))
    return BoundaryValue(_name(v), "Tensor", meta.shape, meta.dtype)


def _torch_boundary(part: Partition, block: Block) -> tuple[list[Value], list[Value]]:
    """Run-time values a torch block reads from outside (its nested blocks included) and values read after it.

    Build-time values (constants, shape arithmetic) are left out: they are constants on both sides. So are the
    collection nodes around the method's inputs and outputs: the parts they unpack show as x[0], d['key']."""
    members = {n for n in block.nodes if part.decision(n).reason != Fallback.IO_PLUMBING}
    top = part.graph.block()

    def run_time(v: Value) -> bool:
        producer = top_level_node(v.node(), top)
        decision = part.decisions.get(producer)
        return (decision is None or decision.target != Target.STATIC) and producer.kind() != "prim::Constant" \
            and not isinstance(v.type(), torch._C.ClassType)

    ins: list[Value] = []
    outs: list[Value] = []
    for node in (n for n in block.nodes if n in members):
        for v in used_values(node):
            if top_level_node(v.node(), top) not in members and run_time(v) and v not in ins:
                ins.append(v)
        for o in node.outputs():
            if any(top_level_node(u.user, top) not in members for u in o.uses()) and run_time(o) and o not in outs:
                outs.append(o)
    return ins, outs


def make_report(part: Partition, name: str = "") -> PartitionReport:
    """The report of a partition; `name` titles it (e.g. 'Model.forward')."""
    reports = []
    for block in part.blocks:
        decisions = [part.decision(n) for n in block.nodes]
        if block.is_engine:
            ops = tuple(node_key(n) for n, d in zip(block.nodes, decisions) if is_layer_op(n, d))
            ins, outs, fallback = block.inputs, block.outputs, ()
        else:
            left = [(n, d) for n, d in zip(block.nodes, decisions) if d.is_fallback]
            ops = tuple(node_key(n) for n, _ in left)
            ins, outs = _torch_boundary(part, block)
            fallback = tuple(FallbackOp(node_key(n), d.reason, d.detail, source_location(n)) for n, d in left)
        if not ops:
            continue
        reports.append(BlockReport(len(reports), "engine" if block.is_engine else "torch", ops,
                                   tuple(_value(part, v) for v in ins), tuple(_value(part, v) for v in outs),
                                   fallback))
    return PartitionReport(tuple(reports), name)
