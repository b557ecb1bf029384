"""Merge the quantized linear layers that read one quantized activation into one multiply.

Attention's query, key and value projections each read the block's input through their own dequantize layer of
one quantizer (builder/passes/quantize.py gives every reader its own). Where several such multiplies x @ W_i.T
(+ b_i) read one quantized tensor through dequantize layers of the same type, scale and zero point, and each weight
is a constant quantized per output channel, they become one multiply by the weights concatenated along their output
channels: every channel keeps its own scale and its bias, so each output value is the same sum of the same products,
exactly. Each former output is then a slice of the merged one's columns. One GEMM of N = sum N_i replaces several
narrow ones: on an H200, the int8 products of a 768-wide encoder over 4096 tokens took 3 x 11.5 us as three
[768, 768] GEMMs and 20.1 us as one [768, 2304].

Only for backends whose registry row says so (`Backend.merges_linears`: the cuda backend, whose plans read such
slices as views). ONNX Runtime copies each `Slice`: a 4-layer, 256-wide BERT-style int8 engine (2 threads,
interleaved) took 6.35 against 6.52 ms merged at batch 1, but 35.3 against 32.5 at batch 8.
"""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends import BACKENDS


def merge_quantized_linears(network: Network, settings: BuildSettings) -> bool:
    if not BACKENDS[settings.backend].merges_linears:
        return False
    readers = network.consumers()
    groups: dict[tuple, list[L.MatrixMultiplyLayer]] = {}
    for layer in network.layers:
        key = _key(network, layer, readers)
        if key is not None:
            groups.setdefault(key, []).append(layer)
    changed = False
    for members in groups.values():
        if len(members) >= 2:
            _merge(network, members)
            changed = True
    if changed:
        network.reinfer()
    return changed


def _key(network: Network, mm: L.Layer, readers: dict[int, list[L.Layer]]) -> tuple | None:
    """What multiplies merge on (their quantized input and how it is dequantized, the weights' depth and type, the
    output's dtype, whether they add a bias), or None if `mm` is not a quantized linear layer that can merge: its
    dequantize layers and weight read by it alone, its output not the network's."""
    if not isinstance(mm, L.MatrixMultiplyLayer) or mm.op0 != L.MatrixOperation.NONE \
            or mm.op1 != L.MatrixOperation.TRANSPOSE or mm.inputs[0].rank < 2 or mm.outputs[0] in network.outputs:
        return None  # (a network output keeps its tensor, and its name)
    dqx, dqw = mm.inputs[0].producer, mm.inputs[1].producer
    if not (isinstance(dqx, L.DequantizeLayer) and isinstance(dqw, L.DequantizeLayer)) or dqx.axis is not None \
            or dqw.axis != 0 or set(dqw.weights) != {"scale"}:
        return None
    constant = dqw.inputs[0].producer
    if not isinstance(constant, L.ConstantLayer) or constant.get_output().rank != 2 \
            or any(network.sole_reader(t, readers) is not r for t, r in
                   ((dqx.outputs[0], mm), (dqw.outputs[0], mm), (constant.outputs[0], dqw))):
        return None
    bias = mm.weights.get("bias")
    if bias is not None and bias.dim() != 1:
        return None
    parameters = tuple((name, tuple(w.flatten().tolist()), str(w.dtype)) for name, w in sorted(dqx.weights.items()))
    return (id(dqx.inputs[0]), parameters, dqx.quant_type, dqx.to_type, dqw.quant_type, str(dqw.weights["scale"].dtype),
            constant.get_output().shape[1], str(constant.weights["value"].dtype), mm.outputs[0].dtype,
            bias is not None, None if bias is None else str(bias.dtype))


def _merge(network: Network, members: list[L.MatrixMultiplyLayer]) -> None:
    """The first multiply takes every member's weights, scales and biases (in order); each member's output becomes
    a slice of its columns, placed just after the merged multiply."""
    first = members[0]
    dqws = [mm.inputs[1].producer for mm in members]
    constants = [dq.inputs[0].producer for dq in dqws]
    widths = [c.weights["value"].shape[0] for c in constants]
    constants[0].weights = {"value": torch.cat([c.weights["value"] for c in constants])}
    dqws[0].weights = {"scale": torch.cat([dq.weights["scale"].reshape(-1) for dq in dqws])}
    if "bias" in first.weights:
        first.weights = {**first.weights, "bias": torch.cat([mm.weights["bias"] for mm in members])}
    olds = [mm.outputs[0] for mm in members]
    merged = Tensor(olds[0].name, (*olds[0].shape[:-1], sum(widths)), olds[0].dtype, first)
    first.outputs = [merged]
    for k in range(1, len(members)):  # the merged multiply reads what the first one read: it runs first
        network.remove_layers({id(x) for x in (members[k], members[k].inputs[0].producer, dqws[k], constants[k])})
    at = network.layers.index(first) + 1
    offset = 0
    for old, width in zip(olds, widths):
        lead = old.shape[:-1]
        piece = network.add_slice(merged, [0] * len(lead) + [offset], [*lead, width], [1] * old.rank)
        network.layers.remove(piece)
        network.layers.insert(at, piece)
        at += 1
        network.replace_all_uses(old, piece.get_output())
        offset += width
