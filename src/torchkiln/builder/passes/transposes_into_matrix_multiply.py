"""A matrix multiply reading an operand transposed in its last two dims reads it untransposed, with its op flipped
(NONE <-> TRANSPOSE): `q @ k.transpose(-1, -2)` multiplies k as it lies, as cuBLAS takes a transposed operand,
instead of a copy of k transposed first. A transpose other layers also read stays for them. An elementwise layer
with a constant scalar between the transpose and the multiply (`q @ (k.transpose(-1, -2) / scale)`) is applied to
the untransposed operand instead: on every element alike, it commutes with the transpose."""
from __future__ import annotations

import logging

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor

logger = logging.getLogger("torchkiln.builder")

_FLIPPED = {L.MatrixOperation.NONE: L.MatrixOperation.TRANSPOSE, L.MatrixOperation.TRANSPOSE: L.MatrixOperation.NONE}


def _scalar_elementwise(layer: L.Layer | None) -> int | None:
    """Which input of `layer` is its tensor operand, where it is an elementwise layer whose other input is a
    constant scalar of the same dtype; else None."""
    if not isinstance(layer, L.ElementWiseLayer):
        return None
    for i, other in ((0, layer.inputs[1]), (1, layer.inputs[0])):
        value = L.constant_value(other)
        if value is not None and value.numel() == 1 and value.dtype == layer.inputs[i].dtype \
                and layer.inputs[i].shape == layer.outputs[0].shape:
            return i
    return None


def _untransposed(network: Network, operand: Tensor, readers: dict[int, list[L.Layer]]) -> Tensor | None:
    """`operand` transposed back without a copy: the transpose's input, or the scalar elementwise layer between
    them applied to that input (a new layer where the old one stands); None where `operand` is neither."""
    direct = L.matrix_transposed(operand)
    if direct is not None:
        return direct
    scaled = operand.producer
    i = _scalar_elementwise(scaled)
    if i is None or network.sole_reader(operand, readers) is None:
        return None
    moved = L.matrix_transposed(scaled.inputs[i])
    if moved is None:
        return None
    pair = [moved, scaled.inputs[1 - i]][::1 if i == 0 else -1]
    made = network.add_elementwise(*pair, scaled.op)
    network.move_before(made, scaled)
    return made.get_output()


def transposes_into_matrix_multiply(network: Network, settings: BuildSettings) -> bool:
    changed = False
    readers = network.consumers()
    for layer in list(network.layers):
        if not isinstance(layer, L.MatrixMultiplyLayer):
            continue
        for i, op in ((0, "op0"), (1, "op1")):
            operand = layer.inputs[i]
            flipped = _FLIPPED.get(getattr(layer, op))
            if flipped is None:
                continue
            untransposed = _untransposed(network, operand, readers)
            if untransposed is None:
                continue
            layer.inputs[i] = untransposed
            setattr(layer, op, flipped)
            logger.debug("matrix multiply %r reads operand %d untransposed (%s %s)", layer.name, i, op, flipped.name)
            changed = True
    return changed
