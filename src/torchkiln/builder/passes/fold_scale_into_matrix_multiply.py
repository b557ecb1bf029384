"""Fold a per-column scale (a batch norm over a linear layer's features) that follows a matrix multiply by a constant
weight into the weight and the bias: one GEMM instead of a GEMM and a pass over its output.

(x @ W + b) * s + t == x @ (W * s) + (b * s + t) with s, t per output column. Reshapes between the multiply and the
scale are allowed where they keep the last dim (a batch norm over flattened tokens: flatten, scale, unflatten), since
they keep every value's column."""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def _column_weights(scale: L.ScaleLayer, columns: int) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
    """The scale's factor and shift per column (None where it has none), or None if it is not per column."""
    x = scale.inputs[0]
    if "power" in scale.weights or not x.rank:
        return None
    if scale.mode == L.ScaleMode.UNIFORM or (scale.mode == L.ScaleMode.CHANNEL and
                                             scale.channel_axis % x.rank == x.rank - 1):
        return tuple(None if (w := scale.weights.get(k)) is None else w.reshape(-1).expand(columns)
                     for k in ("scale", "shift"))
    return None


def fold_scale_into_matrix_multiply(network: Network, settings: BuildSettings) -> bool:
    changed = False
    readers = network.consumers()
    for matmul in list(network.layers):
        if not isinstance(matmul, L.MatrixMultiplyLayer) or matmul.op1 == L.MatrixOperation.VECTOR:
            continue
        weight = matmul.inputs[1].producer
        if not isinstance(weight, L.ConstantLayer) or weight.weights["value"].dim() != 2 \
                or network.sole_reader(weight.get_output(), readers) is not matmul \
                or not matmul.get_output().dtype.is_floating_point:
            continue
        value = matmul.get_output()
        layer = network.sole_reader(value, readers)
        while isinstance(layer, L.ShuffleLayer) and layer.keeps_last_dim():
            layer = network.sole_reader(layer.get_output(), readers)
        if not isinstance(layer, L.ScaleLayer):
            continue
        w = weight.weights["value"]
        columns = w.shape[0 if matmul.op1 == L.MatrixOperation.TRANSPOSE else 1]
        found = _column_weights(layer, columns)
        if found is None:
            continue
        s, t = found
        bias = matmul.weights.get("bias")
        bias = torch.zeros(columns, dtype=torch.float32) if bias is None else bias.float().expand(columns)
        if s is not None:
            factor = s.float().reshape(1, -1) if matmul.op1 == L.MatrixOperation.NONE else s.float().reshape(-1, 1)
            w = w.float() * factor
            bias = bias * s.float()
        if t is not None:
            bias = bias + t.float()
        weight.weights = {"value": w.to(weight.weights["value"].dtype)}
        matmul.weights = {"bias": bias.to(value.dtype).contiguous()}
        network.replace_all_uses(layer.get_output(), layer.inputs[0])
        network.remove_layers({id(layer)})
        readers = network.consumers()
        changed = True
    return changed
