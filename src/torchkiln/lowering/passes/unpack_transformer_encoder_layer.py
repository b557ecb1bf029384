"""Unpack aten::_transformer_encoder_layer_fwd, the fused kernel nn.TransformerEncoderLayer calls in eval mode without
gradients (its "fast path": batch-first input, equal layer-norm epsilons, a ReLU or GELU feed-forward), into the
layer's own ops: the in-projection, scaled dot-product attention, the out-projection, the residual adds, the layer norms
and the feed-forward, in ATen's order (transformer.cpp: the attention output plus its input, then the norm; or with
norm_first, the norm first). No converter takes the fused op: without this pass the whole encoder stays in PyTorch.

Only a layer called without a mask is unpacked: the fused kernel takes a merged boolean or float mask of its own
convention (`mask_type`), and a layer given one stays in PyTorch, with that reason in the partition report.

A traced layer records the fused call (torchkiln traces without gradients, as eager inference runs). A scripted one
holds it behind Ifs on run-time checks (grad mode, autocast, the inputs' devices), which the build-time evaluators
answer for inference once shapes are known; the compiler runs this pass again then (`compiler._AFTER_SHAPES`).
"""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph

_HEAD = "%src, %E, %H, %qkv_w, %qkv_b, %proj_w, %proj_b"  # the op's arguments before use_gelu and norm_first...
_TAIL = "%eps, %n1w, %n1b, %n2w, %n2b, %f1w, %f1b, %f2w, %f2b"  # ... and after them, up to the mask


def _attention(x: str, out: str) -> str:
    """IR computing `out` = the layer's self-attention of `x` [B, T, E]: one projection to q, k and v (the rows of
    qkv_w in that order, H heads of E / H columns each), attention scaled by 1 / sqrt(E / H), the out-projection."""
    return f"""
            %qkv = aten::linear({x}, %qkv_w, %qkv_b)
            %B : int = aten::size({x}, %zero)
            %T : int = aten::size({x}, %one)
            %D : int = aten::floordiv(%E, %H)
            %split : int[] = prim::ListConstruct(%B, %T, %three, %H, %D)
            %qkv5 = aten::reshape(%qkv, %split)
            %order : int[] = prim::ListConstruct(%two, %zero, %three, %one, %four)
            %heads = aten::permute(%qkv5, %order)
            %q = aten::select(%heads, %zero, %zero)
            %k = aten::select(%heads, %zero, %one)
            %v = aten::select(%heads, %zero, %two)
            %att = aten::scaled_dot_product_attention(%q, %k, %v, %none, %zero_f, %false, %none, %false)
            %att_t = aten::transpose(%att, %one, %two)
            %merged : int[] = prim::ListConstruct(%B, %T, %E)
            %att_m = aten::reshape(%att_t, %merged)
            %{out} = aten::linear(%att_m, %proj_w, %proj_b)"""


def _feed_forward(x: str, gelu: bool, out: str) -> str:
    activation = "aten::gelu(%hidden, %exact)" if gelu else "aten::relu(%hidden)"
    return f"""
            %hidden = aten::linear({x}, %f1w, %f1b)
            %active = {activation}
            %{out} = aten::linear(%active, %f2w, %f2b)"""


def _norm(x: str, which: int, out: str) -> str:
    return f"""
            %{out} = aten::layer_norm({x}, %shape, %n{which}w, %n{which}b, %eps, %false)"""


def _replacement(gelu: bool, norm_first: bool) -> str:
    body = """
            %none : NoneType = prim::Constant()
            %false : bool = prim::Constant[value=0]()
            %zero : int = prim::Constant[value=0]()
            %one : int = prim::Constant[value=1]()
            %two : int = prim::Constant[value=2]()
            %three : int = prim::Constant[value=3]()
            %four : int = prim::Constant[value=4]()
            %zero_f : float = prim::Constant[value=0.]()
            %exact : str = prim::Constant[value="none"]()
            %shape : int[] = prim::ListConstruct(%E)"""
    if norm_first:
        body += _norm("%src", 1, "n1") + _attention("%n1", "a") + """
            %x1 = aten::add(%a, %src, %one)""" + _norm("%x1", 2, "n2") + _feed_forward("%n2", gelu, "f") + """
            %y = aten::add(%f, %x1, %one)"""
    else:
        body += _attention("%src", "a") + """
            %s1 = aten::add(%a, %src, %one)""" + _norm("%s1", 1, "x1") + _feed_forward("%x1", gelu, "f") + """
            %s2 = aten::add(%f, %x1, %one)""" + _norm("%s2", 2, "y")
    return f"""
        graph({_HEAD}, {_TAIL}, %mask_type):{body}
            return (%y)"""


def _pattern(gelu: bool, norm_first: bool) -> str:
    return f"""
        graph({_HEAD}, {_TAIL}, %mask_type):
            %mask : NoneType = prim::Constant()
            %use_gelu : bool = prim::Constant[value={int(gelu)}]()
            %norm_first : bool = prim::Constant[value={int(norm_first)}]()
            %y = aten::_transformer_encoder_layer_fwd({_HEAD}, %use_gelu, %norm_first, {_TAIL}, %mask, %mask_type)
            return (%y)"""


_FUSED = "aten::_transformer_encoder_layer_fwd"


@lowering_pass(replaces=(_FUSED,), decomposition=True)
def unpack_transformer_encoder_layer(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace a mask-free aten::_transformer_encoder_layer_fwd by the encoder layer's ops (module docstring)."""
    changed = False
    for gelu in (False, True):
        for norm_first in (False, True):
            changed |= rewrite(graph, _pattern(gelu, norm_first), _replacement(gelu, norm_first))
    return changed
