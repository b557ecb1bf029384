"""Channel gates at the full size of the map they scale, so that ONNX Runtime keeps its blocked layout through them.

ORT's NCHWc transformer runs convolutions, pools, activations, adds and same-shape multiplies on channel-blocked
tensors (8 channels a block with AVX2, 16 with AVX-512). A multiply whose operands' shapes differ is not
transformed: a squeeze-excitation's `x * gate` ([N, C, H, W] by [N, C, 1, 1]) takes x out of the blocked layout, runs
in NCHW and puts the product back, two reorders of the whole map per gate. Written as `x * Resize(gate)` (nearest,
to [N, C, H, W]: each gate value repeated over the map) the operands have equal shapes and the blocked layout goes on
wherever the gate's own 1x1 convolutions are blocked (their widths multiples of the block): a network of inverted
residual blocks with such gates, at 96 x 96, lost all 18 of its mid-graph reorders. The values are exactly the
broadcast's.

Whether it pays depends on the network (where the gate itself is not blocked, the resize only adds a write), so it is
a session tactic (session_settings.py, `("full_gates", True)`) timed against the graph as exported.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import has_symbols

if TYPE_CHECKING:
    import onnx

# ORT blocks a channel-shaped add already (both operands reshaped to its blocked 5-D form, then a broadcast), but
# takes a multiply out of the blocked layout: its broadcast over a channel block does not vectorize well
OPS = {"Mul": L.ElementWiseOperation.PROD}


def gate_shapes(big: tuple, small: tuple) -> bool:
    """Whether `small` is a per-channel gate of a 4-D map of shape `big`: [N, C, 1, 1] against [N, C, H, W] with
    H * W > 1, all static."""
    return (len(big) == len(small) == 4 and all(isinstance(d, int) for d in (*big, *small)) and
            tuple(small[:2]) == tuple(big[:2]) and tuple(small[2:]) == (1, 1) and big[2] * big[3] > 1)


def has_gates(network: Network) -> bool:
    """Whether `network` multiplies a map by a channel gate (`gate_shapes`): where the tactic is worth timing."""
    for layer in network.layers:
        if isinstance(layer, L.ElementWiseLayer) and layer.op in OPS.values() and not has_symbols(
                [t.shape for t in layer.inputs]):
            a, b = (tuple(t.shape) for t in layer.inputs)
            if gate_shapes(a, b) or gate_shapes(b, a):
                return True
    return False


def full_size_gates(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with each float32 Mul of a map by a channel gate (shapes from ONNX's shape inference) reading the
    gate resized to the map's size (nearest: every value repeated), and how many were rewritten."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    inferred = shape_inference.infer_shapes(model)
    graph = inferred.graph
    values = (*graph.value_info, *graph.input, *graph.output)
    shapes = {v.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim)
              for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}  # (what ORT blocks)
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in graph.node:
        if node.op_type in OPS and node.domain in ("", "ai.onnx") and len(node.input) == 2:
            a, b = (shapes.get(name, ()) for name in node.input)
            for k, (big, small) in enumerate(((b, a), (a, b))):  # k: the gate's input index
                if not gate_shapes(big, small):
                    continue
                scales = f"torchkiln_gate_scales_{rewritten}"
                graph.initializer.append(numpy_helper.from_array(np.array([1, 1, *big[2:]], np.float32), scales))
                full = f"torchkiln_full_gate_{rewritten}"
                nodes.append(helper.make_node("Resize", [node.input[k], "", scales], [full], mode="nearest",
                                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"))
                node.input[k] = full
                rewritten += 1
                break
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return inferred, rewritten
