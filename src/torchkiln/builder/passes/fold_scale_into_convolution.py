"""Fold a per-channel scale (batch norm) into the convolution before it, or into the one after it where that
convolution pads nothing."""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def _per_channel(scale: L.Layer, channels: int) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
    """A scale layer's multiplier and shift, each `channels` values (one per channel of dim 1) or None; None where
    the layer is no scale of dim 1 (another axis, a power)."""
    if not isinstance(scale, L.ScaleLayer) or "power" in scale.weights:
        return None
    if not (scale.mode == L.ScaleMode.UNIFORM or
            scale.mode == L.ScaleMode.CHANNEL and scale.channel_axis % scale.inputs[0].rank == 1):
        return None
    found = [scale.weights.get(name) for name in ("scale", "shift")]
    if any(w is not None and w.numel() not in (1, channels) for w in found):
        return None
    return tuple(None if w is None else w.reshape(-1).expand(channels) for w in found)


def fold_scale_into_convolution(network: Network, settings: BuildSettings) -> bool:
    """conv'(x) for scale(conv(x)): each output channel's kernel and bias times its multiplier, plus its shift."""
    changed = False
    readers = network.consumers()
    for scale in list(network.layers):
        conv = scale.inputs[0].producer if isinstance(scale, L.ScaleLayer) else None
        if not isinstance(conv, L.ConvolutionLayer) or conv.transposed \
                or network.sole_reader(conv.get_output(), readers) is not scale:
            continue
        channels = conv.weights["kernel"].shape[0]
        found = _per_channel(scale, channels)
        if found is None:
            continue
        s, b = found
        kernel = conv.weights["kernel"]
        bias = conv.weights.get("bias", torch.zeros(channels, dtype=kernel.dtype))
        if s is not None:
            kernel = kernel * s.reshape([-1] + [1] * (kernel.dim() - 1))
            bias = bias * s
        if b is not None:
            bias = bias + b
        conv.weights = {"kernel": kernel, "bias": bias}
        network.replace_all_uses(scale.get_output(), conv.get_output())
        network.remove_layers({id(scale)})
        readers = network.consumers()  # the convolution's output now has the scale's readers
        changed = True
    return changed


def fold_scale_into_next_convolution(network: Network, settings: BuildSettings) -> bool:
    """conv'(x) for conv(scale(x)) where the convolution pads nothing (a pre-norm block's batch norm before its 1x1
    convolution): each kernel tap times the multiplier of its input channel, and the bias plus the kernel's taps
    times the shifts. With padding it would not be exact: the padded zeros are not shifted."""
    changed = False
    readers = network.consumers()
    for conv in list(network.layers):
        if not isinstance(conv, L.ConvolutionLayer) or conv.transposed or any(conv.padding):
            continue
        scale = conv.inputs[0].producer
        if not isinstance(scale, L.ScaleLayer) or network.sole_reader(scale.get_output(), readers) is not conv:
            continue
        kernel = conv.weights["kernel"]
        out_channels, per_group = kernel.shape[:2]
        found = _per_channel(scale, per_group * conv.groups)
        if found is None:
            continue
        s, b = found
        group = torch.arange(out_channels) // (out_channels // conv.groups)  # each output channel's group
        taps = [out_channels, per_group] + [1] * (kernel.dim() - 2)  # one value per (output, input) channel pair

        def per_pair(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(conv.groups, per_group)[group].reshape(taps).to(kernel.dtype)

        bias = conv.weights.get("bias")
        bias = torch.zeros(out_channels, dtype=kernel.dtype) if bias is None else bias
        if b is not None:
            bias = bias + (kernel * per_pair(b)).sum(dim=tuple(range(1, kernel.dim())))
        if s is not None:
            kernel = kernel * per_pair(s)
        conv.weights = {"kernel": kernel, "bias": bias}
        network.replace_all_uses(scale.get_output(), scale.inputs[0])
        network.remove_layers({id(scale)})
        readers = network.consumers()  # the scale's input now has the convolution for a reader
        changed = True
    return changed
