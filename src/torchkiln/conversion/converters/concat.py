"""Concatenation converters: cat and stack (TorchScript emits torch.concat/concatenate as aten::cat)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.shuffle import unsqueeze
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::cat")
def cat(ctx: ConversionCtx, args: Args) -> Tensor:
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    rank = max(t.rank for t in tensors)
    return ctx.network.add_concatenation(tensors, normalize_dim(args.dim, rank)).get_output()


@converter("aten::stack")
def stack(ctx: ConversionCtx, args: Args) -> Tensor:
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    dim = normalize_dim(args.dim, tensors[0].rank + 1)
    return ctx.network.add_concatenation([unsqueeze(ctx, t, dim) for t in tensors], dim).get_output()
