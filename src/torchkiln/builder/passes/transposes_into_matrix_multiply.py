"""A matrix multiply reading an operand transposed in its last two dims reads it untransposed, with its op flipped
(NONE <-> TRANSPOSE): `q @ k.transpose(-1, -2)` multiplies k as it lies, as cuBLAS takes a transposed operand,
instead of a copy of k transposed first. A transpose other layers also read stays for them."""
from __future__ import annotations

import logging

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network

logger = logging.getLogger("torchkiln.builder")

_FLIPPED = {L.MatrixOperation.NONE: L.MatrixOperation.TRANSPOSE, L.MatrixOperation.TRANSPOSE: L.MatrixOperation.NONE}


def _swap(rank: int) -> tuple[int, ...]:
    return (*range(rank - 2), rank - 1, rank - 2)


def transposes_into_matrix_multiply(network: Network, settings: BuildSettings) -> bool:
    changed = False
    for layer in network.layers:
        if not isinstance(layer, L.MatrixMultiplyLayer):
            continue
        for i, op in ((0, "op0"), (1, "op1")):
            operand = layer.inputs[i]
            flipped = _FLIPPED.get(getattr(layer, op))
            if flipped is None or operand.rank < 2 or L.transposition(operand.producer) != _swap(operand.rank):
                continue
            layer.inputs[i] = operand.producer.inputs[0]
            setattr(layer, op, flipped)
            logger.debug("matrix multiply %r reads operand %d untransposed (%s %s)", layer.name, i, op, flipped.name)
            changed = True
    return changed
