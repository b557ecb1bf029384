"""Converting one engine block: walk its nodes in order, evaluate or convert each, mark outputs."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.analysis.registry import find_converter, find_evaluator
from torchkiln.conversion import load_all
from torchkiln.conversion.control_flow import (convert_if, convert_loop, convert_predicate, convert_shape_predicate,
                                               is_tensor_predicate)
from torchkiln.analysis.resolve import NotStatic, is_dynamic
from torchkiln.errors import ConversionError, NetworkError, cause_line
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import agree_on_samples, symbols_of
from torchkiln.ir.tensor import Tensor
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Node, TensorMeta, Value, binding_name, source_location, value_key

logger = logging.getLogger("torchkiln.conversion")


def describe_node(node: Node) -> str:
    """'%y = aten::relu(%x) at model.py:12' for error messages."""
    outs = ", ".join(f"%{o.debugName()}" for o in node.outputs())
    ins = ", ".join(f"%{i.debugName()}" for i in node.inputs())
    return f"{outs} = {node.kind()}({ins}) at {source_location(node)}"


def _check_args(node: Node, args) -> None:
    for value, arg in zip(node.inputs(), args):
        if isinstance(arg, TensorMeta) or (isinstance(arg, (list, tuple)) and any(isinstance(a, TensorMeta) for a in arg)):
            producer = value.node().kind()
            raise ConversionError(f"{describe_node(node)}: input %{value.debugName()} comes from {producer}, "
                                  f"which was neither converted nor evaluated in this engine block")


def _node_error(node: Node, e: Exception) -> ConversionError:
    """A ConversionError naming `node`, which it keeps as `.node`."""
    if isinstance(e, ConversionError) and node.kind() in str(e):
        message = str(e)
    else:
        ours = isinstance(e, (ConversionError, NotStatic, NetworkError))
        message = f"{describe_node(node)}: {e}" if ours else f"{describe_node(node)}: {type(e).__name__}: {cause_line(e)}"
    error = ConversionError(message)
    error.node = node
    return error


_TRUNCATED = {torch.float64: torch.float32, torch.int64: torch.int32}


def _truncated(value: Any) -> Any:
    """With truncate_long_and_double, constant tensors (weights) are 32-bit like the engine's inputs."""
    if isinstance(value, torch.Tensor) and value.dtype in _TRUNCATED:
        return value.to(_TRUNCATED[value.dtype])
    if isinstance(value, (list, tuple)):
        return type(value)(_truncated(v) for v in value)
    return value


_CONTROL_FLOW = {"prim::If": convert_if, "prim::Loop": convert_loop}


def _convert_node(ctx: ConversionCtx, node: Node) -> None:
    outputs = list(node.outputs())
    shape_predicate = convert_shape_predicate(ctx, node)  # before control flow: `a and b` is an If
    if shape_predicate is not None:
        ctx.value_tensor_map[value_key(outputs[0])] = shape_predicate
        return
    control_flow = _CONTROL_FLOW.get(node.kind())
    if control_flow is not None:
        ctx.value_tensor_map.update(zip(map(value_key, outputs), control_flow(ctx, node, _convert_node)))
        return
    if is_tensor_predicate(ctx, node):
        ctx.value_tensor_map[value_key(outputs[0])] = convert_predicate(ctx, node)
        return
    converter = find_converter(node)
    if converter is None:
        evaluator = find_evaluator(node)
        if evaluator is None:
            raise ConversionError(f"{describe_node(node)}: no converter or evaluator for {node.kind()}")
        if not outputs:  # a side effect (a warning): done at build time
            evaluator.fn(ctx.args(node))
            return
        ctx.resolve(outputs[0])
        for out in outputs:
            key = value_key(out)
            if key in ctx.evaluated_value_map and is_dynamic(ctx.evaluated_value_map[key]):
                ctx.value_tensor_map[key] = ctx.evaluated_value_map.pop(key)
        return
    if ctx.foldable(node) and ctx.fold(node) is not None:  # build-time values in, build-time values out
        return
    args = ctx.args(node)
    _check_args(node, args)
    if ctx.settings.truncate_long_and_double:
        args.values = [_truncated(v) for v in args.values]
    result = converter.fn(ctx, args)
    results = [result] if len(outputs) == 1 else list(result)
    if len(results) != len(outputs):
        raise ConversionError(f"{describe_node(node)}: converter gave {len(results)} outputs for {len(outputs)}")
    for out, value in zip(outputs, results):
        if is_dynamic(value):
            ctx.value_tensor_map[value_key(out)] = value
        else:
            ctx.evaluated_value_map[value_key(out)] = value


def _agree(shape: tuple, meta_shape: tuple, data: set) -> bool:
    """A converted shape and the one PyTorch gave agree: at every sample of their symbols, except in the dims that
    depend on the data (nonzero's count: whatever the examples gave), which only have to be there."""
    keep = [i for i, d in enumerate(shape) if not symbols_of(d) & data]
    return len(shape) == len(meta_shape) and agree_on_samples(tuple(shape[i] for i in keep),
                                                              tuple(meta_shape[i] for i in keep))


def _check_symbols(net: Network) -> None:
    """Dynamic shapes: every symbolic dim in the network must be bound by an input dim at run time."""
    bound = set(net.symbols())
    for layer in net.layers:
        used = symbols_of([t.shape for t in layer.outputs]) | symbols_of(list(layer.params().values()))
        if not used <= bound:
            raise ConversionError(f"layer {layer.name!r} needs a static shape: it uses "
                                  f"{sorted(s.name for s in used - bound)}, which no engine input dim defines")


def convert_block(
    nodes: Sequence[Node],
    inputs: Sequence[Value],
    outputs: Sequence[Value],
    metas: Mapping[int, TensorMeta],
    settings: CompileSettings,
    name: str,
) -> Network:
    """Build the network of one engine block; its inputs and outputs are in the given order."""
    load_all()
    ctx = ConversionCtx(settings, metas, name)
    net = ctx.network
    for v in inputs:
        meta = metas[value_key(v)]
        t = net.add_input(binding_name(v), meta.dtype, meta.shape)
        if settings.truncate_long_and_double and meta.dtype in (torch.int64, torch.float64):
            t = net.add_cast(t, torch.int32 if meta.dtype == torch.int64 else torch.float32).get_output()
        ctx.value_tensor_map[value_key(v)] = t
    for node in nodes:
        net.scope = f"{node.kind()}(%{node.outputsAt(0).debugName()})" if node.outputsSize() else node.kind()
        first = len(net.layers)
        try:
            _convert_node(ctx, node)
        except Exception as e:  # a converter's bug too: the compiler falls back to PyTorch for this node
            raise _node_error(node, e) from e
        origin = (net.scope, source_location(node))
        net.origins.update((layer.name, origin) for layer in net.layers[first:])
    net.scope = "output"
    data = set(net.data_symbols())
    for v in outputs:
        t = ctx.value_tensor_map.get(value_key(v))
        if not isinstance(t, Tensor):
            raise _node_error(v.node(), ConversionError(f"engine block output %{v.debugName()} (from "
                                                        f"{v.node().kind()}) is not a network tensor"))
        meta = metas[value_key(v)]
        if t.dtype != meta.dtype:
            truncated = {t.dtype, meta.dtype} in ({torch.int32, torch.int64}, {torch.float32, torch.float64})
            if not (settings.truncate_long_and_double and truncated):
                raise _node_error(v.node(), ConversionError(f"converted to dtype {t.dtype} but PyTorch gives "
                                                            f"{meta.dtype}"))
            t = net.add_cast(t, meta.dtype).get_output()
        if t.shape != meta.shape and not _agree(t.shape, meta.shape, data):  # symbolic: same at min/opt/max
            raise _node_error(v.node(), ConversionError(f"converted to shape {t.shape} but PyTorch gives "
                                                        f"{meta.shape}"))
        if t in net.inputs or t in net.outputs:
            t = net.add_identity(t).get_output()
        net.mark_output(t)
    _check_symbols(net)
    logger.debug("converted block %s:\n%s", name, net)
    return net
