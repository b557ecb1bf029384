"""Activation converters."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import functional_inplace
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor


def activation(ctx: ConversionCtx, x, kind: L.ActivationType, alpha: float = 0.0, beta: float = 0.0) -> Tensor:
    return ctx.network.add_activation(ctx.to_tensor(x), kind, alpha, beta).get_output()


@converter("aten::relu")
def relu(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, L.ActivationType.RELU)


@converter("aten::relu_", capability=functional_inplace)
def relu_(ctx: ConversionCtx, args: Args) -> Tensor:
    return relu(ctx, args)


@converter("aten::sigmoid")
def sigmoid(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, L.ActivationType.SIGMOID)


@converter("aten::tanh")
def tanh(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, L.ActivationType.TANH)
