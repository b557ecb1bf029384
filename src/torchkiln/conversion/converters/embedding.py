"""Embedding lookup as a gather of the weight's rows (padding_idx only matters for training)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::embedding")
def embedding(ctx: ConversionCtx, args: Args) -> Tensor:
    return ctx.network.add_gather(ctx.to_tensor(args.weight), ctx.to_tensor(args.indices), axis=0).get_output()
