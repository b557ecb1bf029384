"""ir/cost.py: what a layer's reference meaning may cost, the FLOPs and workspace the engine ceilings add up."""
import math

import torch
from test_onnx_export import ALL_CASES

from torchkiln.ir import cost
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol


def test_every_layer_of_every_kind_has_a_finite_cost():
    seen = set()
    for name, build in ALL_CASES:
        net, _ = build(torch.Generator().manual_seed(0))
        for layer in net.layers:
            flops, workspace = cost.flops(layer), cost.workspace_bytes(layer)
            assert 0 <= flops < math.inf and 0 <= workspace < math.inf, f"{name}: {layer.KIND}"
            seen.add(layer.KIND)
    assert seen == set(L.LAYER_KINDS), set(L.LAYER_KINDS) - seen


def test_products_convolutions_and_attention_count_their_multiply_adds():
    n = Network("costs")
    a = n.add_input("a", torch.float32, (2, 3, 4))
    product = n.add_matrix_multiply(a, L.MatrixOperation.NONE, n.add_constant(torch.ones(4, 5)).get_output(),
                                    L.MatrixOperation.NONE)
    assert cost.flops(product) == 2 * (2 * 3 * 5) * 4 + 2 * 3 * 5
    x = n.add_input("x", torch.float32, (1, 3, 8, 8))
    conv = n.add_convolution_nd(x, torch.ones(4, 3, 3, 3), None, stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    assert cost.flops(conv) == 2 * (4 * 8 * 8) * (3 * 3 * 3) + 4 * 8 * 8
    assert cost.workspace_bytes(conv) == 2 * 4 * (3 * 64 + 4 * 64)  # float32: oneDNN's reordered copies
    q = n.add_input("q", torch.float32, (1, 2, 16, 8))
    attention = n.add_attention(q, q, q)
    scores = 2 * 16 * 16
    assert cost.flops(attention) == scores * (2 * (8 + 8) + 5) + 4 * 256
    assert cost.workspace_bytes(attention) == 4 * 3 * scores + 3 * 4 * 256  # the math path, and operand copies


def test_a_dynamic_dim_costs_its_largest_value():
    n = Network("dynamic")
    s = DimSymbol("s0", 1, 1000)
    x = n.add_input("x", torch.float32, (s, 16))
    neg = n.add_unary(x, L.UnaryOperation.NEG)
    assert cost.flops(neg) == 2 * 1000 * 16 and cost.nbytes(neg.get_output()) == 4 * 1000 * 16
    fill = n.add_fill(4, 0.0, 1.0, torch.float32)
    assert cost.workspace_bytes(fill) == 3 * 8 * 4  # the float64 index, its product with step, the sum
