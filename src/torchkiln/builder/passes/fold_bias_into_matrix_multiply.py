"""Fold a constant bias added after a matrix multiply into the multiply (one GEMM, like nn.Linear)."""
from __future__ import annotations

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def fold_bias_into_matrix_multiply(network: Network, settings: BuildSettings) -> bool:
    changed = False
    readers = network.consumers()
    for add in list(network.layers):
        if not isinstance(add, L.ElementWiseLayer) or add.op != L.ElementWiseOperation.SUM:
            continue
        for product, other in (add.inputs, reversed(add.inputs)):
            matmul, constant = product.producer, other.producer
            if not isinstance(matmul, L.MatrixMultiplyLayer) or "bias" in matmul.weights \
                    or not isinstance(constant, L.ConstantLayer):
                continue
            bias = constant.weights["value"]
            columns = product.shape[-1] if product.shape else None
            fits = bias.dim() <= 1 and bias.numel() in (1, columns) and bias.dtype == product.dtype
            if not fits or product in network.outputs or len(readers.get(id(product), [])) != 1 \
                    or add.get_output().shape != product.shape:
                continue
            matmul.weights = {"bias": bias.expand(columns).contiguous()}
            network.replace_all_uses(add.get_output(), product)
            network.remove_layers({id(add)})
            changed = True
            break
    return changed
