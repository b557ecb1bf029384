"""Control flow inside an engine: a `prim::If` becomes a conditional layer and a `prim::Loop` a loop layer, each
block converted into a sub-network (TensorRT's IIfConditionalLayer and ILoopLayer).

A block is converted by the block converter's own node walk with the context's network swapped for the
sub-network; every run-time tensor the block reads from outside (`torchscript.outer_values`) becomes an input of
the sub-network, bound in `value_tensor_map` while the block converts, so no layer of a sub-network reads a tensor
of another network. The condition is `bool(tensor)` (`aten::Bool`, which partitioning keeps in the engine only where
it is read as a condition), or a condition on dynamic dims their ranges do not decide (`x.size(1) > 64`, and `not`,
`and`, `or` of such: `analysis/shape_conditions.py`): a 0-d bool tensor here, the latter computed from the input
shapes alone (dim_value layers, comparisons, logical layers), so the conditional layer reading it has a shape-only
predicate (`ir/shape_only.py`).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch

from torchkiln.analysis.shape_conditions import dim_comparison, is_shape_condition, static_bool
from torchkiln.conversion.context import ConversionCtx
from torchkiln.errors import ConversionError
from torchkiln.ir import cost
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import is_symbolic, symbols_of
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import Node, Value, outer_values, value_key

ConvertNode = Callable[[ConversionCtx, Node], None]
_UNBOUND = object()
# A loop of unknown trip count (a while loop) gets as many iterations as fit WHILE_LOOP_FLOPS (about 20 s of one
# CPU core, under the engine loader's default ceilings), at most MAX_LOOP_TRIPS; one whose body is so costly that
# fewer than MIN_WHILE_TRIPS fit stays in PyTorch.
WHILE_LOOP_FLOPS = 1e12
MIN_WHILE_TRIPS = 64


def is_tensor_predicate(ctx: ConversionCtx, node: Node) -> bool:
    """`bool(t)` of a network tensor (a condition computed at run time)."""
    return node.kind() == "aten::Bool" and isinstance(ctx.known(node.inputsAt(0))[1], Tensor)


def convert_predicate(ctx: ConversionCtx, node: Node) -> Tensor:
    """bool(t) of a one-element tensor as a 0-d bool tensor: t != 0 (NaN is true, as in Python)."""
    t = ctx.known(node.inputsAt(0))[1]
    numel = math.prod(t.shape)
    if is_symbolic(numel) or numel != 1:
        raise ConversionError(f"bool() of a tensor of shape {list(t.shape)}: it needs exactly one element")
    flag = ctx.network.add_shuffle(t, reshape_dims=()).get_output() if t.rank else t
    if flag.dtype != torch.bool:
        zero = ctx.network.add_constant(torch.zeros((), dtype=flag.dtype)).get_output()
        flag = ctx.network.add_elementwise(flag, zero, L.ElementWiseOperation.NOT_EQUAL).get_output()
    return flag


_COMPARISONS = {"eq": L.ElementWiseOperation.EQUAL, "ne": L.ElementWiseOperation.NOT_EQUAL,
                "lt": L.ElementWiseOperation.LESS, "le": L.ElementWiseOperation.LESS_EQUAL,
                "gt": L.ElementWiseOperation.GREATER, "ge": L.ElementWiseOperation.GREATER_EQUAL}


def convert_shape_predicate(ctx: ConversionCtx, node: Node) -> Tensor | None:
    """A condition on dynamic dims the ranges do not decide (`analysis/shape_conditions.py`) as a 0-d bool tensor
    of the input shapes; None for any other node."""
    if not is_shape_condition(node, ctx.resolve):
        return None
    comparison = dim_comparison(node, ctx.resolve)
    if comparison is not None:
        op, a, b = comparison
        lhs, rhs = ctx.to_tensor(a, torch.int64), ctx.to_tensor(b, torch.int64)
        return ctx.network.add_elementwise(lhs, rhs, _COMPARISONS[op]).get_output()
    if node.kind() == "aten::__not__":
        return ctx.network.add_unary(_condition(ctx, node.inputsAt(0)), L.UnaryOperation.NOT).get_output()
    then_block, else_block = node.blocks()  # `and` / `or`: an If giving one bool
    picked = [_condition(ctx, list(block.outputs())[0]) for block in (then_block, else_block)]
    return ctx.network.add_select(_condition(ctx, node.inputsAt(0)), *picked).get_output()


def _condition(ctx: ConversionCtx, v: Value) -> Tensor:
    """The 0-d bool tensor of a build-time bool or a shape condition (converted once)."""
    hit, known = ctx.known(v)
    if hit:
        return known
    constant = static_bool(v, ctx.resolve)
    if constant is not None:
        return ctx.to_tensor(constant, torch.bool)
    ctx.value_tensor_map[value_key(v)] = convert_shape_predicate(ctx, v.node())
    return ctx.value_tensor_map[value_key(v)]


def _outer_tensors(ctx: ConversionCtx, node: Node) -> list[tuple[Value, Tensor]]:
    """The network tensors the node's blocks read from outside it (static values stay static inside)."""
    found = []
    for v in outer_values(node):
        hit, value = ctx.known(v)
        if isinstance(value, Tensor):
            found.append((v, value))
        elif hit:
            raise ConversionError(f"its blocks read %{v.debugName()}, a {type(value).__name__} of run-time tensors")
    return found


@contextlib.contextmanager
def _inside(ctx: ConversionCtx, sub: Network, bound: dict[int, Tensor]) -> Iterator[None]:
    """Convert into `sub`, with the values in `bound` read as its tensors."""
    saved = ctx.network, {k: ctx.value_tensor_map.get(k, _UNBOUND) for k in bound}
    ctx.network = sub
    ctx.value_tensor_map.update(bound)
    try:
        yield
    finally:
        ctx.network = saved[0]
        for k, old in saved[1].items():
            if old is _UNBOUND:
                ctx.value_tensor_map.pop(k, None)
            else:
                ctx.value_tensor_map[k] = old


def _subnetwork(ctx: ConversionCtx, block: torch._C.Block, name: str,
                params: Sequence[tuple[Value, torch.dtype, tuple]], convert: ConvertNode) -> Network:
    """The block as a network whose inputs stand for `params` (value, dtype, shape), in order."""
    sub = Network(name)
    bound = {value_key(v): sub.add_input(f"{name}_in{k}", dtype, shape) for k, (v, dtype, shape) in enumerate(params)}
    with _inside(ctx, sub, bound):
        for inner in block.nodes():
            convert(ctx, inner)
        for out in block.outputs():
            t = ctx.to_tensor(ctx.resolve(out))
            sub.mark_output(sub.add_identity(t).get_output() if t in sub.outputs else t)
    for layer in sub.layers:  # the runtimes bind dynamic dims in the outer network's layers only
        if symbols_of(list(layer.params().values())):
            raise ConversionError(f"{layer.KIND} layer {layer.name!r} in {name} has a parameter computed from dynamic "
                                  f"dims, which a sub-network cannot take")
    return sub


def _specs(values: Sequence[tuple[Value, Tensor]]) -> list[tuple[Value, torch.dtype, tuple]]:
    return [(v, t.dtype, t.shape) for v, t in values]


def convert_if(ctx: ConversionCtx, node: Node, convert: ConvertNode) -> list[Tensor]:
    """A conditional layer: the If's blocks as branches over the tensors they read."""
    predicate = ctx.resolve(node.inputsAt(0))
    if not isinstance(predicate, Tensor):
        raise ConversionError("its condition is not a tensor of the engine")
    operands = _outer_tensors(ctx, node)
    then_block, else_block = node.blocks()
    branches = [_subnetwork(ctx, block, f"{ctx.network.scope}/{key}", _specs(operands), convert)
                for block, key in ((then_block, "then"), (else_block, "else"))]
    return ctx.network.add_conditional(predicate, [t for _, t in operands], *branches).outputs


def convert_loop(ctx: ConversionCtx, node: Node, convert: ConvertNode) -> list[Tensor]:
    """A loop layer: the body over (iteration, carried values, the tensors it reads), at most max_trips times: the
    trip count where it is known and small enough, else what WHILE_LOOP_FLOPS allows (a while loop)."""
    trips_value, condition, *initial = node.inputs()
    trips, go = ctx.resolve(trips_value), ctx.resolve(condition)
    body = next(node.blocks())
    next_condition = list(body.outputs())[0]
    endless = go is True and next_condition.node().kind() == "prim::Constant" and ctx.resolve(next_condition) is True
    if endless and isinstance(trips, int) and trips > L.MAX_LOOP_TRIPS:
        raise ConversionError(f"a loop of {trips} iterations: an engine runs at most {L.MAX_LOOP_TRIPS}")
    carried = [ctx.to_tensor(ctx.resolve(v)) for v in initial]
    read = _outer_tensors(ctx, node)
    iteration, *params = list(body.inputs())
    specs = [(iteration, torch.int64, ()), *_specs(list(zip(params, carried))), *_specs(read)]
    sub = _subnetwork(ctx, body, f"{ctx.network.scope}/body", specs, convert)
    if isinstance(trips, int) and trips <= L.MAX_LOOP_TRIPS:
        max_trips = max(trips, 0)
    else:
        max_trips = int(min(L.MAX_LOOP_TRIPS, WHILE_LOOP_FLOPS // max(cost.network_flops(sub), 1.0)))
        if max_trips < MIN_WHILE_TRIPS:
            raise ConversionError(f"a loop of unknown trip count whose body costs {cost.network_flops(sub):.3g} "
                                  f"FLOPs: fewer than {MIN_WHILE_TRIPS} iterations fit an engine's "
                                  f"{WHILE_LOOP_FLOPS:.0e}-FLOP budget for it")
    return ctx.network.add_loop(ctx.to_tensor(trips, torch.int64), ctx.to_tensor(go, torch.bool), carried,
                                [t for _, t in read], sub, max_trips).outputs
