"""Fold a per-channel scale (batch norm) that follows a convolution into its kernel and bias."""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def fold_scale_into_convolution(network: Network, settings: BuildSettings) -> bool:
    changed = False
    readers = network.consumers()
    for scale in list(network.layers):
        if not isinstance(scale, L.ScaleLayer) or "power" in scale.weights:
            continue
        conv = scale.inputs[0].producer
        if not isinstance(conv, L.ConvolutionLayer) or conv.transposed:
            continue
        conv_out = conv.get_output()
        if conv_out in network.outputs or len(readers.get(id(conv_out), [])) != 1:
            continue
        channels = conv.weights["kernel"].shape[0]
        if scale.mode == L.ScaleMode.CHANNEL and scale.channel_axis % conv_out.rank == 1:
            s = scale.weights.get("scale")
            b = scale.weights.get("shift")
        elif scale.mode == L.ScaleMode.UNIFORM:
            s = None if "scale" not in scale.weights else scale.weights["scale"].reshape(1).expand(channels)
            b = None if "shift" not in scale.weights else scale.weights["shift"].reshape(1).expand(channels)
        else:
            continue
        kernel = conv.weights["kernel"]
        bias = conv.weights.get("bias", torch.zeros(channels, dtype=kernel.dtype))
        if s is not None:
            kernel = kernel * s.reshape([-1] + [1] * (kernel.dim() - 1))
            bias = bias * s
        if b is not None:
            bias = bias + b
        conv.weights = {"kernel": kernel, "bias": bias}
        network.replace_all_uses(scale.get_output(), conv_out)
        network.remove_layers({id(scale)})
        changed = True
    return changed
