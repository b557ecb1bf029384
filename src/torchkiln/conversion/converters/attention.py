"""scaled_dot_product_attention as one attention layer (inference: no dropout)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network.tensor import Tensor


def _attention_ok(args: Args) -> str | None:
    if args.dropout_p != 0:
        return f"dropout_p={args.dropout_p} (attention dropout is random)"
    if args.get("enable_gqa"):
        return "enable_gqa=True (grouped-query attention)"
    return None


@converter("aten::scaled_dot_product_attention", capability=_attention_ok)
def scaled_dot_product_attention(ctx: ConversionCtx, args: Args) -> Tensor:
    mask = None if args.attn_mask is None else ctx.to_tensor(args.attn_mask)
    q, k, v = (ctx.to_tensor(t) for t in (args.query, args.key, args.value))
    return ctx.network.add_attention(q, k, v, mask, causal=args.is_causal, scale=args.scale).get_output()
