"""Normalize transposed convolutions into aten::_convolution, the form tracing records."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


def _flag(value: bool) -> str:
    return f"prim::Constant[value={int(value)}]()"


@lowering_pass(replaces=("aten::conv_transpose1d", "aten::conv_transpose2d.input", "aten::conv_transpose3d.input"),
               decomposition=True)
def normalize_conv_transpose(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::conv_transpose{1,2,3}d by aten::_convolution(transposed=True).

    That is the call conv_transpose makes; the cuDNN flags are today's global settings, as in a trace.
    """
    cudnn = torch.backends.cudnn
    deterministic = cudnn.deterministic or torch.are_deterministic_algorithms_enabled()
    changed = False
    for nd in (1, 2, 3):
        changed |= rewrite(graph, f"""
            graph(%x, %w, %b, %stride, %padding, %output_padding, %groups, %dilation):
                %y = aten::conv_transpose{nd}d(%x, %w, %b, %stride, %padding, %output_padding, %groups, %dilation)
                return (%y)""", f"""
            graph(%x, %w, %b, %stride, %padding, %output_padding, %groups, %dilation):
                %transposed : bool = {_flag(True)}
                %benchmark : bool = {_flag(cudnn.benchmark)}
                %deterministic : bool = {_flag(deterministic)}
                %cudnn_enabled : bool = {_flag(cudnn.enabled)}
                %allow_tf32 : bool = {_flag(cudnn.allow_tf32)}
                %y = aten::_convolution(%x, %w, %b, %stride, %padding, %dilation, %transposed, %output_padding, %groups, %benchmark, %deterministic, %cudnn_enabled, %allow_tf32)
                return (%y)""")
    return changed
