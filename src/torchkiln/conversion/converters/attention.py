"""scaled_dot_product_attention as one attention layer (inference: no dropout)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static
from torchkiln.conversion.impl.matmul import linear
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


def _attention_ok(args: Args) -> str | None:
    if args.dropout_p != 0:
        return f"dropout_p={args.dropout_p} (attention dropout is random)"
    if args.get("enable_gqa"):
        q, k, v = (args.query.shape, args.key.shape, args.value.shape)
        heads = [x[-3] if len(x) >= 3 else None for x in (q, k, v)]
        if not all(isinstance(h, int) for h in heads) or heads[1] != heads[2] or heads[1] == 0 \
                or heads[0] % heads[1]:
            return f"enable_gqa=True with query/key/value heads {heads} (static, key and value the same and " \
                   f"dividing the query's)"
    return None


@converter("aten::scaled_dot_product_attention", capability=_attention_ok)
def scaled_dot_product_attention(ctx: ConversionCtx, args: Args) -> Tensor:
    mask = None if args.attn_mask is None else ctx.to_tensor(args.attn_mask)
    q, k, v = (ctx.to_tensor(t) for t in (args.query, args.key, args.value))
    return ctx.network.add_attention(q, k, v, mask, causal=args.is_causal, scale=args.scale,
                                     enable_gqa=bool(args.get("enable_gqa"))).get_output()


def _native_mha_ok(args: Args) -> str | None:
    """nn.MultiheadAttention's inference fast path, without a mask and without returned weights."""
    if args.mask is not None:
        return "an attention mask (a merged key-padding/attention mask)"
    if args.need_weights:
        return "need_weights=True (averaged attention weights)"
    if args.node.outputsAt(1).uses():
        return "its second output (empty without need_weights) is read"
    if len(args.query.shape) != 3:
        return f"a query of rank {len(args.query.shape)} (batched (N, L, E) only)"
    return needs_static(args, "qkv_weight", "qkv_bias", "proj_weight", "proj_bias")


@converter("aten::_native_multi_head_attention", capability=_native_mha_ok)
def native_multi_head_attention(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    """Project q, k, v with the packed weights, split heads, attend, merge heads, project out."""
    embed, heads = args.embed_dim, args.num_head
    w, b = args.qkv_weight, args.qkv_bias

    def heads_of(x, part: int) -> Tensor:
        projected = linear(ctx, ctx.to_tensor(x), w[part * embed:(part + 1) * embed], b[part * embed:(part + 1) * embed])
        batch, length = projected.shape[:2]
        return permute(ctx, reshape(ctx, projected, [batch, length, heads, embed // heads]), [0, 2, 1, 3])

    q, k, v = (heads_of(x, i) for i, x in enumerate((args.query, args.key, args.value)))
    out = permute(ctx, ctx.network.add_attention(q, k, v).get_output(), [0, 2, 1, 3])
    merged = reshape(ctx, out, [out.shape[0], out.shape[1], embed])
    result = linear(ctx, merged, args.proj_weight, args.proj_bias)
    return result, result  # the second output is never read (see the capability)
