"""The engine IR, the reference runtime and the builder passes, tested on hand-built networks."""
import pytest
import torch

from torchkiln.errors import NetworkError
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.ir.reference import MEANINGS

F32 = torch.float32


def _bindings(net):
    return [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in net.inputs]


def every_kind_network():
    """One network holding a layer of every kind, with non-default parameters where possible."""
    n = Network("all_kinds")
    x = n.add_input("x", F32, (2, 4, 6, 6))
    q = n.add_input("q", F32, (2, 2, 5, 8))
    idx = n.add_input("idx", torch.int64, (3,))
    c = n.add_convolution_nd(x, torch.randn(4, 2, 3, 3), torch.randn(4), stride=(1, 1), padding=(1, 1),
                             dilation=(1, 1), groups=2).get_output()
    ct = n.add_convolution_nd(c, torch.randn(4, 3, 2, 2), None, stride=(2, 2), padding=(0, 0), dilation=(1, 1),
                              transposed=True, output_padding=(1, 1)).get_output()
    s = n.add_scale(c, L.ScaleMode.CHANNEL, scale=torch.rand(4) + 0.5, shift=torch.randn(4)).get_output()
    a = n.add_activation(s, L.ActivationType.LEAKY_RELU, alpha=0.1).get_output()
    p = n.add_parametric_relu(a, torch.rand(4)).get_output()
    u = n.add_unary(p, L.UnaryOperation.ABS).get_output()
    e = n.add_elementwise(u, n.add_constant(torch.tensor(2.0)).get_output(), L.ElementWiseOperation.POW).get_output()
    pool = n.add_pooling_nd(e, L.PoolingType.MAX, (2, 2), stride=(2, 2), padding=(0, 0), ceil_mode=True).get_output()
    red = n.add_reduce(pool, L.ReduceOperation.AVG, (2, 3), keep_dims=False).get_output()
    sm = n.add_softmax(red, 1, log=True).get_output()
    sh = n.add_shuffle(ct, first_transpose=(0, 2, 3, 1), reshape_dims=(0, -1, 3)).get_output()
    mm = n.add_matrix_multiply(sh, L.MatrixOperation.NONE, n.add_constant(torch.randn(5, 3)).get_output(),
                               L.MatrixOperation.TRANSPOSE).get_output()
    sl = n.add_slice(mm, (0, 1, 4), (2, 3, 2), (1, 2, -2)).get_output()
    cat = n.add_concatenation([sl, sl], 2).get_output()
    ex = n.add_expand(n.add_constant(torch.randn(1, 3, 1)).get_output(), (2, 3, 4)).get_output()
    g = n.add_gather(cat, idx, 1).get_output()
    sc = n.add_scatter(ex, n.add_constant(torch.tensor([[[0, 1, 2, 3]] * 3] * 2)).get_output(), cat,
                       axis=2).get_output()
    cond = n.add_elementwise(sc, n.add_constant(torch.tensor(0.0)).get_output(),
                             L.ElementWiseOperation.GREATER).get_output()
    sel = n.add_select(cond, sc, ex).get_output()
    top = n.add_topk(sel, L.TopKOperation.MIN, 2, 2)
    rz = n.add_resize(x, "bilinear", scales=(1.5, 1.5), align_corners=False).get_output()
    pad = n.add_padding(rz, (1, 2, 0, 1), L.PaddingMode.REFLECT).get_output()
    norm = n.add_normalization(pad, L.NormalizationKind.GROUP, 1e-5, torch.rand(4), torch.randn(4),
                               num_groups=2).get_output()
    ein = n.add_einsum([q, q], "bhqd,bhkd->bhqk").get_output()
    cum = n.add_cumulative(ein, L.CumulativeOperation.SUM, -1).get_output()
    fill = n.add_fill(5, 0.5, 0.25, F32).get_output()
    shp = n.add_shape(norm).get_output()
    cast = n.add_cast(shp, F32).get_output()
    ident = n.add_identity(fill).get_output()
    gs = n.add_grid_sample(x, n.add_constant(torch.rand(2, 3, 3, 2) * 2 - 1).get_output(), "bilinear", "border",
                           False).get_output()
    att = n.add_attention(q, q, q, causal=True).get_output()
    dim = n.add_layer(L.DimValueLayer, [], value=3).get_output()
    fq = n.add_fake_quantize(gs, torch.tensor([0.01, 0.02, 0.03, 0.04]), torch.tensor([1, 0, -2, 3]), axis=1)
    nz = n.add_non_zero(cond).get_output()
    uq = n.add_unique(idx, consecutive=True)
    # control flow: a conditional on a value of the network, holding a loop over a weight-bearing body
    flag = n.add_reduce(n.add_elementwise(sm, n.add_constant(torch.tensor(0.5)).get_output(),
                                          L.ElementWiseOperation.GREATER).get_output(), L.ReduceOperation.ANY, (0, 1),
                        False).get_output()
    loop_net = Network("branch")
    v = loop_net.add_input("v", F32, tuple(sm.shape))
    body = Network("body")
    i, c = body.add_input("i", torch.int64, ()), body.add_input("c", F32, tuple(sm.shape))
    scaled = body.add_scale(c, L.ScaleMode.UNIFORM, torch.tensor([0.5]), torch.tensor([1.0])).get_output()
    body.mark_output(body.add_elementwise(i, body.add_constant(torch.tensor(2)).get_output(),
                                          L.ElementWiseOperation.LESS).get_output())
    body.mark_output(scaled)
    trips = loop_net.add_constant(torch.tensor(5)).get_output()
    go = loop_net.add_constant(torch.tensor(True)).get_output()
    loop_net.mark_output(loop_net.add_loop(trips, go, [v], [], body, 5).get_output())
    passed = Network("passed")
    passed.mark_output(passed.add_input("v", F32, tuple(sm.shape)))
    branch = n.add_conditional(flag, [sm], loop_net, passed).get_output()
    for t in (fq, sm, g, top.get_output(0), top.get_output(1), norm, cum, ident, cast, gs, att, dim, nz,
              *uq.outputs, branch):
        n.mark_output(t)
    return n


def test_every_layer_kind_has_a_reference_meaning():
    assert set(L.LAYER_KINDS.values()) == set(MEANINGS)


def test_every_layer_kind_round_trips_through_engine_bytes():
    net = every_kind_network()
    nested = [getattr(layer, f) for layer in net.layers for f in layer.SUBNETWORKS]
    kinds = {type(layer) for network in (net, *nested, *(getattr(layer, f) for sub in nested for layer in sub.layers
                                                          for f in layer.SUBNETWORKS)) for layer in network.layers}
    assert kinds == set(L.LAYER_KINDS.values())
    inputs = [torch.randn(2, 4, 6, 6), torch.randn(2, 2, 5, 8), torch.tensor([2, 1, 0])]
    engine = Engine(net, _bindings(net), "cpu", F32, "all_kinds")
    expected = engine.execute(inputs)
    again = Engine.deserialize(engine.serialize())
    assert str(again.network) == str(net)
    for a, b in zip(again.execute(inputs), expected):
        assert torch.equal(a, b)


def test_shape_inference_rejects_bad_layers_where_they_are_added():
    n = Network()
    x = n.add_input("x", F32, (2, 3))
    with pytest.raises(NetworkError, match=r"elementwise layer .* rejects inputs .*x\[2, 3\].*\[4\]"):
        n.add_elementwise(x, n.add_constant(torch.zeros(4)).get_output(), L.ElementWiseOperation.SUM)
    with pytest.raises(NetworkError, match="missing weights"):
        n.add_layer(L.ConvolutionLayer, [x], stride=(1,), padding=(0,), dilation=(1,))


def test_dump_is_readable():
    n = Network("tiny")
    x = n.add_input("x", F32, (1, 3))
    n.mark_output(n.add_activation(x, L.ActivationType.RELU).get_output())
    text = str(n)
    assert text.splitlines()[0] == "network tiny(%x: float32[1, 3]):"
    assert "activation[type=RELU, alpha=0.0, beta=0.0](%x)" in text


def test_engine_outputs_never_alias_inputs_or_weights():
    n = Network()
    x = n.add_input("x", F32, (2, 3))
    c = n.add_constant(torch.ones(6)).get_output()
    n.mark_output(n.add_shuffle(x, reshape_dims=(3, 2)).get_output())
    n.mark_output(c)
    engine = Engine(n, _bindings(n), "cpu", F32)
    x_in = torch.randn(2, 3)
    kept = x_in.clone()
    view, const = engine.execute([x_in])
    view.add_(1)
    const.add_(1)
    assert torch.equal(x_in, kept)  # writing to the output did not write to the input
    assert torch.equal(engine.execute([x_in])[1], torch.ones(6))  # nor to the engine's weight
