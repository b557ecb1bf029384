"""The ordered builder pipeline: target-independent rewrites, then precision.

The order, and why:

1. eliminate_identities first, so every later pattern sees producers directly (a no-op cast or reshape
   between a convolution and its batch norm would hide the pair); broadcasts_for_expands with it, so a pattern
   sees an expanded operand's source broadcast (a norm dividing the rows it reduced).
2. fold_scale_into_convolution: a batch norm (a per-channel scale) after a convolution goes into its
   kernel and bias, in fp32, before precision narrows the weights; fold_scale_into_next_convolution then folds
   one before a convolution that pads nothing (a pre-norm block's batch norm and 1x1 convolution).
3. fold_constants before fold_bias_into_matrix_multiply: a bias computed from constants becomes one
   constant the bias fold can take. attention_from_matmuls between them: a position bias computed from constants
   is then one constant whose rows it can check, and the bias fold does not take the scores' matrix multiply.
   gelu_from_pointwise after the fold too, so that a formula's coefficients computed from constants (sqrt(2 / pi))
   are single constants.
   causal_attention_masks and grouped_query_attention after it, so attention written by hand gets them too: a
   folded causal mask becomes the causal flag, and key/value heads repeated for grouped-query attention are read
   unrepeated (remove_dead_layers then drops the copies). fold_scale_into_matrix_multiply after the bias fold: a
   batch norm over a linear layer's features scales the bias the fold put in the multiply, and its weight, in fp32.
4. remove_dead_layers, so precision does not cast values nothing reads.
5. quantize_layers (post-training quantization) after the folds, so a convolution's kernel is quantized with its
   batch norm folded in and a matrix multiply's bias is in its epilogue; before precision, which leaves quantized
   layers in float32 (their dequantized values are exact there). merge_quantized_linears right after it: the
   quantized linear layers of one quantized input (query, key and value) become one multiply and slices of its
   columns, before precision places casts on its output.
6. lower_precision last of the rewrites: it picks each layer's precision on the final graph.
7. casts_before_movement after precision: a narrowing cast the precision pass put after a reshape moves before it,
   so it joins the kernel that makes the value instead of being a pass of its own.
8. transposes_into_matrix_multiply after it, so a cast moved before a transpose no longer hides the transpose from
   the multiply it feeds (the multiply then reads the operand untransposed).
9. additive_attention_masks after precision, so each boolean mask becomes its additive form once in the dtype
   its attention layers finally compute in.
10. remove_dead_layers again: precision replaces fp32 constants read in low precision by narrowed copies, and a
    transpose the multiplies no longer read goes.
"""
from __future__ import annotations

import logging

from torchkiln.builder.passes import BuildPass
from torchkiln.builder.passes.additive_attention_masks import additive_attention_masks
from torchkiln.builder.passes.attention_from_matmuls import attention_from_matmuls
from torchkiln.builder.passes.broadcast_expands import broadcasts_for_expands
from torchkiln.builder.passes.casts_before_movement import casts_before_movement
from torchkiln.builder.passes.causal_attention_masks import causal_attention_masks
from torchkiln.builder.passes.constant_folding import fold_constants
from torchkiln.builder.passes.dead_layer_removal import remove_dead_layers
from torchkiln.builder.passes.fold_bias_into_matrix_multiply import fold_bias_into_matrix_multiply
from torchkiln.builder.passes.fold_scale_into_convolution import (fold_scale_into_convolution,
                                                                  fold_scale_into_next_convolution)
from torchkiln.builder.passes.fold_scale_into_matrix_multiply import fold_scale_into_matrix_multiply
from torchkiln.builder.passes.gelu_from_pointwise import gelu_from_pointwise
from torchkiln.builder.passes.grouped_query_attention import grouped_query_attention
from torchkiln.builder.passes.identity_elimination import eliminate_identities
from torchkiln.builder.passes.merge_quantized_linears import merge_quantized_linears
from torchkiln.builder.passes.precision import lower_precision
from torchkiln.builder.passes.quantize import quantize_layers
from torchkiln.builder.passes.transposes_into_matrix_multiply import transposes_into_matrix_multiply
from torchkiln.builder.settings import BuildSettings
from torchkiln.ir.network import Network

logger = logging.getLogger("torchkiln.builder")

BUILD_PIPELINE: tuple[BuildPass, ...] = (
    eliminate_identities,
    broadcasts_for_expands,
    fold_scale_into_convolution,
    fold_scale_into_next_convolution,
    fold_constants,
    gelu_from_pointwise,
    attention_from_matmuls,
    causal_attention_masks,
    grouped_query_attention,
    fold_bias_into_matrix_multiply,
    fold_scale_into_matrix_multiply,
    remove_dead_layers,
    quantize_layers,
    merge_quantized_linears,
    lower_precision,
    casts_before_movement,
    transposes_into_matrix_multiply,
    additive_attention_masks,
    remove_dead_layers,
)
PASSES: dict[str, BuildPass] = {p.__name__: p for p in BUILD_PIPELINE}


def run_passes(network: Network, settings: BuildSettings) -> list[str]:
    """Run the pipeline over `network` in place; the names of the passes that changed it, in order."""
    fired = []
    for p in BUILD_PIPELINE:
        before = len(network.layers)
        changed = p(network, settings)
        if changed:
            fired.append(p.__name__)
            logger.debug("network after builder pass %s (%d -> %d layers):\n%s", p.__name__, before,
                         len(network.layers), network)
        else:
            logger.debug("builder pass %s: no change", p.__name__)
    return fired
