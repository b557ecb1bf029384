"""Builder passes, each run alone on a hand-built network and compared with the network before it."""
import math

import pytest
import torch

import torchkiln

from torchkiln.builder import BuildSettings, build_engine
from torchkiln.builder.pipeline import PASSES
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.engine import Engine, InputBinding

F32 = torch.float32


def _bindings(net):
    return [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in net.inputs]


def _run_pass(name, net, settings=BuildSettings()):
    return PASSES[name](net, settings)


def _kinds(net):
    return [layer.KIND for layer in net.layers]


def test_constant_folding_before_and_after():
    n = Network()
    x = n.add_input("x", F32, (2, 3))
    w = n.add_constant(torch.randn(3)).get_output()
    w2 = n.add_unary(n.add_elementwise(w, w, L.ElementWiseOperation.SUM).get_output(), L.UnaryOperation.EXP)
    n.mark_output(n.add_elementwise(x, w2.get_output(), L.ElementWiseOperation.PROD).get_output())
    x_in = torch.randn(2, 3)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert _kinds(n) == ["constant", "elementwise", "unary", "elementwise"]
    assert _run_pass("fold_constants", n)
    assert _run_pass("remove_dead_layers", n)
    assert _kinds(n) == ["constant", "elementwise"]
    after = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_dead_layers_are_removed():
    n = Network()
    x = n.add_input("x", F32, (4,))
    n.add_unary(x, L.UnaryOperation.EXP)  # read by nothing
    n.mark_output(n.add_unary(x, L.UnaryOperation.NEG).get_output())
    assert _run_pass("remove_dead_layers", n)
    assert _kinds(n) == ["unary"] and n.layers[0].op == L.UnaryOperation.NEG
    assert not _run_pass("remove_dead_layers", n)


def test_identities_are_eliminated_but_outputs_kept():
    n = Network()
    x = n.add_input("x", F32, (2, 3))
    i = n.add_identity(x).get_output()
    same = n.add_cast(i, F32).get_output()
    noop = n.add_shuffle(same, reshape_dims=(2, 3)).get_output()
    out = n.add_activation(noop, L.ActivationType.RELU).get_output()
    n.mark_output(out)
    n.mark_output(n.add_identity(out).get_output())  # an output may be an identity of another
    assert _run_pass("eliminate_identities", n)
    assert _kinds(n) == ["activation", "identity"]
    assert n.layers[0].inputs[0] is x


def test_a_broadcasting_layer_reads_an_expands_input_where_its_other_operand_spans_the_dims():
    """x / ||x||.expand_as(x) (F.normalize's form) divides by the norm itself: same values, and the expand, read by
    no one else, goes. An expand whose dims no other operand has (two row values), one read by a unary layer, and
    one read twice by one layer stay."""
    n = Network()
    x = n.add_input("x", F32, (2, 3, 5))
    row = n.add_input("row", F32, (3, 1))
    norm = n.add_reduce(x, L.ReduceOperation.SUM, [2], keep_dims=True).get_output()  # [2, 3, 1]
    spread = n.add_expand(norm, (2, 3, 5)).get_output()
    n.mark_output(n.add_elementwise(x, spread, L.ElementWiseOperation.DIV).get_output())
    added = n.add_expand(row, (2, 3, 5)).get_output()  # a rank it lacks (2) and a dim (5): x has both
    n.mark_output(n.add_select(n.add_input("keep", torch.bool, (2, 3, 5)), added, x).get_output())
    alone = n.add_expand(norm, (2, 3, 4)).get_output()  # dim 2 (4) is in no other operand
    n.mark_output(n.add_elementwise(alone, n.add_input("r", F32, (3, 1)), L.ElementWiseOperation.SUM).get_output())
    n.mark_output(n.add_unary(n.add_expand(row, (3, 5)).get_output(), L.UnaryOperation.EXP).get_output())
    twice = n.add_expand(row, (3, 6)).get_output()
    n.mark_output(n.add_elementwise(twice, twice, L.ElementWiseOperation.PROD).get_output())
    feeds = [torch.randn(2, 3, 5), torch.randn(3, 1), torch.rand(2, 3, 5) > 0.5, torch.randn(3, 1)]
    before = Engine(n, _bindings(n), "cpu", F32).execute(feeds)
    assert _run_pass("broadcasts_for_expands", n) and _run_pass("remove_dead_layers", n)
    div, select = (t.producer for t in n.outputs[:2])
    assert div.inputs[1] is norm and select.inputs[1] is row
    assert _kinds(n).count("expand") == 3  # the three that stay
    after = Engine(n, _bindings(n), "cpu", F32).execute(feeds)
    assert all(torch.equal(a, b) for a, b in zip(after, before))


def test_scale_folds_into_convolution():
    n = Network()
    x = n.add_input("x", F32, (1, 3, 8, 8))
    conv = n.add_convolution_nd(x, torch.randn(5, 3, 3, 3), torch.randn(5), stride=(1, 1), padding=(1, 1),
                                dilation=(1, 1))
    scale = n.add_scale(conv.get_output(), L.ScaleMode.CHANNEL, scale=torch.rand(5) + 0.5, shift=torch.randn(5))
    n.mark_output(n.add_activation(scale.get_output(), L.ActivationType.RELU).get_output())
    x_in = torch.randn(1, 3, 8, 8)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert _run_pass("fold_scale_into_convolution", n)
    assert _kinds(n) == ["convolution", "activation"]
    after = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert (after - before).abs().max() <= 1e-5 * before.abs().max()


def test_scale_is_not_folded_when_the_convolution_output_is_read_elsewhere():
    n = Network()
    x = n.add_input("x", F32, (1, 3, 8, 8))
    conv = n.add_convolution_nd(x, torch.randn(5, 3, 3, 3), None, stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    scale = n.add_scale(conv.get_output(), L.ScaleMode.CHANNEL, scale=torch.rand(5))
    n.mark_output(scale.get_output())
    n.mark_output(conv.get_output())
    assert not _run_pass("fold_scale_into_convolution", n)


@pytest.mark.parametrize("kernel, groups, padding, mode", [
    (1, 1, 0, L.ScaleMode.CHANNEL), (3, 2, 0, L.ScaleMode.CHANNEL), (3, 6, 0, L.ScaleMode.UNIFORM),
    (3, 1, 1, L.ScaleMode.CHANNEL)], ids=["1x1", "grouped-3x3", "depthwise-uniform", "padded"])
def test_scale_folds_into_the_next_convolution_where_it_pads_nothing(kernel, groups, padding, mode):
    """A batch norm (scale and shift per input channel, or one for all) before a convolution: folded into its
    kernel and bias where the convolution pads nothing (each output channel takes its own group's channels), the
    same values; before a padded one it stays (the padded zeros would be shifted)."""
    n = Network()
    x = n.add_input("x", F32, (2, 6, 7, 7))
    channels = 6 if mode == L.ScaleMode.CHANNEL else 1
    g = torch.Generator().manual_seed(0)
    scaled = n.add_scale(x, mode, scale=torch.rand(channels, generator=g) + 0.5,
                         shift=torch.randn(channels, generator=g)).get_output()
    conv = n.add_convolution_nd(scaled, torch.randn(12, 6 // groups, kernel, kernel, generator=g),
                                torch.randn(12, generator=g), stride=(1, 1), padding=(padding, padding),
                                dilation=(1, 1), groups=groups)
    n.mark_output(conv.get_output())
    x_in = torch.randn(2, 6, 7, 7, generator=g)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert _run_pass("fold_scale_into_next_convolution", n) == (padding == 0)
    assert _kinds(n) == (["convolution"] if padding == 0 else ["scale", "convolution"])
    after = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert (after - before).abs().max() <= 1e-5 * before.abs().max()


def test_scales_fold_by_who_reads_them_after_each_fold():
    """conv -> s1 -> {s2, relu}: s1 folds into the convolution, whose output then has two readers, so s2 stays (a
    count of readers taken before the first fold would fold s2 too and scale relu's input twice); a scale of one
    value for every channel before a convolution folds like one of a value per channel."""
    n = Network()
    x = n.add_input("x", F32, (1, 3, 6, 6))
    g = torch.Generator().manual_seed(1)
    conv = n.add_convolution_nd(x, torch.randn(4, 3, 1, 1, generator=g), torch.randn(4, generator=g), stride=(1, 1),
                                padding=(0, 0), dilation=(1, 1))
    s1 = n.add_scale(conv.get_output(), L.ScaleMode.CHANNEL, scale=torch.rand(4, generator=g) + 0.5).get_output()
    n.mark_output(n.add_scale(s1, L.ScaleMode.CHANNEL, scale=torch.rand(4, generator=g) + 2).get_output())
    n.mark_output(n.add_activation(s1, L.ActivationType.RELU).get_output())
    one = n.add_scale(x, L.ScaleMode.CHANNEL, scale=torch.tensor([1.5]), shift=torch.tensor([0.25])).get_output()
    n.mark_output(n.add_convolution_nd(one, torch.randn(4, 3, 1, 1, generator=g), None, stride=(1, 1),
                                       padding=(0, 0), dilation=(1, 1)).get_output())
    x_in = torch.randn(1, 3, 6, 6, generator=g)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])
    assert _run_pass("fold_scale_into_convolution", n)
    assert _run_pass("fold_scale_into_next_convolution", n)
    assert _kinds(n) == ["convolution", "scale", "activation", "convolution"]
    for got, ref in zip(Engine(n, _bindings(n), "cpu", F32).execute([x_in]), before):
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_precision_lowering_keeps_declared_input_and_output_dtypes(low):
    n = Network()
    x = n.add_input("x", F32, (4, 16))
    h = n.add_matrix_multiply(x, L.MatrixOperation.NONE, n.add_constant(torch.randn(8, 16)).get_output(),
                              L.MatrixOperation.TRANSPOSE).get_output()
    n.mark_output(n.add_softmax(n.add_activation(h, L.ActivationType.GELU_ERF).get_output(), 1).get_output())
    x_in = torch.randn(4, 16)
    reference = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    engine = build_engine(n, _bindings(n), BuildSettings(compute_dtype=low))
    assert n.layers[0].KIND == "cast" and n.layers[0].to_type == low
    assert n.outputs[0].dtype == F32
    assert all(w.dtype == low for layer in n.layers for w in layer.weights.values())
    out = engine.execute([x_in])[0]
    assert out.dtype == F32
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), reference.flatten(), dim=0)
    assert cosine >= 0.999 and (out - reference).abs().max() <= 2e-2


@pytest.mark.parametrize("transposed", [True, False], ids=["linear", "in-out-weight"])
def test_bias_folds_into_matrix_multiply(transposed):
    """x @ W.t() + b (nn.Linear) and x @ W + b (a weight stored [in, out], GPT-2's Conv1D): one GEMM with its
    bias either way (F.linear, addmm), the same values."""
    n = Network()
    x = n.add_input("x", F32, (4, 3, 16))
    w = n.add_constant(torch.randn(8, 16) if transposed else torch.randn(16, 8)).get_output()
    op1 = L.MatrixOperation.TRANSPOSE if transposed else L.MatrixOperation.NONE
    mm = n.add_matrix_multiply(x, L.MatrixOperation.NONE, w, op1).get_output()
    biased = n.add_elementwise(n.add_constant(torch.randn(8)).get_output(), mm, L.ElementWiseOperation.SUM)
    n.mark_output(n.add_activation(biased.get_output(), L.ActivationType.RELU).get_output())
    x_in = torch.randn(4, 3, 16)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert _run_pass("fold_bias_into_matrix_multiply", n)
    assert _run_pass("remove_dead_layers", n)
    assert _kinds(n) == ["constant", "matrix_multiply", "activation"]
    assert n.layers[1].weights["bias"].shape == (8,)
    after = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert (after - before).abs().max() <= 1e-6 * before.abs().max()


@pytest.mark.parametrize("transposed, biased, flattened, mode", [
    (True, True, True, L.ScaleMode.CHANNEL), (False, False, False, L.ScaleMode.CHANNEL),
    (True, False, False, L.ScaleMode.UNIFORM)], ids=["linear-flattened-norm", "in-out-weight", "uniform"])
def test_a_scale_of_a_products_columns_folds_into_its_weight_and_bias(transposed, biased, flattened, mode):
    """A linear layer, then a batch norm over its features (flattened over the tokens, as a 1-d batch norm needs):
    one multiply with the scale in its weight and bias, the same values."""
    n = Network()
    x = n.add_input("x", F32, (2, 5, 16))
    w = n.add_constant(torch.randn(8, 16) if transposed else torch.randn(16, 8)).get_output()
    op1 = L.MatrixOperation.TRANSPOSE if transposed else L.MatrixOperation.NONE
    mm = n.add_matrix_multiply(x, L.MatrixOperation.NONE, w, op1)
    if biased:
        mm.weights = {"bias": torch.randn(8)}
    h = mm.get_output()
    h = n.add_shuffle(h, reshape_dims=(10, 8)).get_output() if flattened else h
    size = 8 if mode == L.ScaleMode.CHANNEL else 1
    h = n.add_scale(h, mode, scale=torch.rand(size) + 0.5, shift=torch.randn(size),
                    channel_axis=h.rank - 1).get_output()
    h = n.add_shuffle(h, reshape_dims=(2, 5, 8)).get_output() if flattened else h
    n.mark_output(n.add_activation(h, L.ActivationType.RELU).get_output())
    x_in = torch.randn(2, 5, 16)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert _run_pass("fold_scale_into_matrix_multiply", n)
    assert "scale" not in _kinds(n)
    after = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert (after - before).abs().max() <= 1e-5 * before.abs().max()


@pytest.mark.parametrize("case", ["rows", "transposed", "read-elsewhere", "shared-weight"])
def test_a_scale_not_per_column_or_of_a_shared_product_is_not_folded(case):
    n = Network()
    x = n.add_input("x", F32, (2, 5, 16))
    w = n.add_constant(torch.randn(8, 16)).get_output()
    h = n.add_matrix_multiply(x, L.MatrixOperation.NONE, w, L.MatrixOperation.TRANSPOSE).get_output()
    if case == "shared-weight":
        n.mark_output(n.add_matrix_multiply(x, L.MatrixOperation.NONE, w, L.MatrixOperation.TRANSPOSE).get_output())
    if case == "transposed":
        h = n.add_shuffle(h, first_transpose=(0, 2, 1)).get_output()  # [2, 8, 5]: the columns move to dim 1
    axis = 1 if case == "rows" else 2
    n.mark_output(n.add_scale(h, L.ScaleMode.CHANNEL, scale=torch.rand(h.shape[axis]) + 0.5,
                              channel_axis=axis).get_output())
    if case == "read-elsewhere":
        n.mark_output(h)
    assert not _run_pass("fold_scale_into_matrix_multiply", n)


GELU_FORMULAS = {  # as models write them out
    "tanh": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0)))),
    "tanh-factored": lambda x: x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))),
    "erf": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "sigmoid-approximation": lambda x: x * torch.sigmoid(1.702 * x),  # not GELU: stays
    "other-coefficient": lambda x: 0.5 * x * (1.0 + torch.tanh(0.8 * (x + 0.044715 * x * x * x))),  # stays
}


class Formula(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.linear, self.name = torch.nn.Linear(8, 8), name

    def forward(self, x):
        return GELU_FORMULAS[self.name](self.linear(x))


class LeakedFormula(torch.nn.Module):
    """GELU's tanh form whose tanh term is also returned."""

    def forward(self, x):
        inner = torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
        return 0.5 * x * (1.0 + inner), inner


@pytest.mark.parametrize("name, expected", [
    ("tanh", L.ActivationType.GELU_TANH), ("tanh-factored", L.ActivationType.GELU_TANH),
    ("erf", L.ActivationType.GELU_ERF), ("sigmoid-approximation", None), ("other-coefficient", None)])
def test_gelu_written_out_becomes_one_activation_layer(name, expected):
    """Recognized by its values on many points in float64: GELU's tanh and erf forms, however a model orders its
    terms or rounds its coefficients; a formula of other values stays as written."""
    torch.manual_seed(0)
    module = Formula(name).eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input((4, 8))], backend="reference")
    network = Engine.deserialize(data).network
    geluish = [layer.type for layer in network.layers if isinstance(layer, L.ActivationLayer)]
    if expected is None:
        assert L.ActivationType.GELU_TANH not in geluish and L.ActivationType.GELU_ERF not in geluish
    else:
        assert geluish == [expected] and _kinds(network).count("elementwise") == 0, _kinds(network)
    x = torch.randn(4, 8) * 3
    out = network_engine(network).execute([x])[0]
    ref = module(x)
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_gelu_formula_whose_partial_values_are_read_elsewhere_stays():
    data = torchkiln.convert_method_to_engine(LeakedFormula().eval(), "forward", [torchkiln.Input((4, 8))],
                                              backend="reference")
    network = Engine.deserialize(data).network
    assert L.ActivationType.GELU_TANH not in [getattr(layer, "type", None) for layer in network.layers]


def network_engine(network):
    return Engine(network, _bindings(network), "cpu", F32)


def test_bias_of_another_shape_is_not_folded():
    n = Network()
    x = n.add_input("x", F32, (4, 16))
    mm = n.add_matrix_multiply(x, L.MatrixOperation.NONE, n.add_constant(torch.randn(8, 16)).get_output(),
                               L.MatrixOperation.TRANSPOSE).get_output()
    n.mark_output(n.add_elementwise(mm, n.add_constant(torch.randn(4, 1)).get_output(),
                                    L.ElementWiseOperation.SUM).get_output())
    assert not _run_pass("fold_bias_into_matrix_multiply", n)


@pytest.mark.parametrize("dtype", [F32, torch.float16])
def test_a_boolean_attention_mask_becomes_its_additive_form_once(dtype):
    """Two attention layers reading one boolean mask: one select makes SDPA's additive mask before the first, both
    read it, and the outputs are what SDPA gives with the boolean mask (exactly: the same conversion)."""
    n = Network()
    q = n.add_input("q", dtype, (2, 4, 8, 16))
    mask = n.add_input("mask", torch.bool, (2, 1, 8, 8))
    first = n.add_layer(L.AttentionLayer, [q, q, q, mask]).get_output()
    n.mark_output(n.add_layer(L.AttentionLayer, [first, first, first, mask]).get_output())
    q_in = torch.randn(2, 4, 8, 16, dtype=dtype)
    m_in = torch.rand(2, 1, 8, 8) > 0.3
    m_in[..., 0] = True  # no row wholly masked
    before = Engine(n, _bindings(n), "cpu", dtype).execute([q_in, m_in])[0]
    assert _run_pass("additive_attention_masks", n)
    assert _kinds(n) == ["constant", "constant", "select", "attention", "attention"]
    assert n.layers[3].inputs[3] is n.layers[4].inputs[3] and n.layers[3].inputs[3].dtype == dtype
    after = Engine(n, _bindings(n), "cpu", dtype).execute([q_in, m_in])[0]
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert not _run_pass("additive_attention_masks", n)  # nothing boolean is left


def _cast_after_reshapes(to_type, extra_reader=False):
    """exp(x) -> reshape -> transpose -> cast: the shape of GPT-2's MLP leaving its fp32 GELU for a flattened GEMM."""
    n = Network()
    x = n.add_input("x", F32, (2, 3, 4))
    e = n.add_unary(x, L.UnaryOperation.EXP).get_output()
    flat = n.add_shuffle(e, reshape_dims=(6, 4)).get_output()
    moved = n.add_shuffle(flat, first_transpose=(1, 0)).get_output()
    n.mark_output(n.add_cast(moved, to_type).get_output())
    if extra_reader:
        n.mark_output(n.add_unary(moved, L.UnaryOperation.ABS).get_output())
    return n


def test_a_narrowing_cast_moves_above_the_shuffles_it_reads():
    n = _cast_after_reshapes(torch.float16)
    x_in = torch.randn(2, 3, 4)
    before = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert _run_pass("casts_before_movement", n)
    assert _kinds(n) == ["unary", "cast", "shuffle", "shuffle"]  # the cast now reads what exp makes
    assert n.layers[1].inputs[0] is n.layers[0].outputs[0] and n.layers[2].outputs[0].dtype == torch.float16
    assert all(t.producer is layer for layer in n.layers for t in layer.outputs)
    after = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert after.dtype == torch.float16 and after.shape == (4, 6) and torch.equal(after, before)
    assert not _run_pass("casts_before_movement", n)


@pytest.mark.parametrize("case", ["widening", "shuffle-read-twice"])
def test_other_casts_stay(case):
    n = _cast_after_reshapes(torch.float64) if case == "widening" else \
        _cast_after_reshapes(torch.float16, extra_reader=True)
    kinds = _kinds(n)  # shuffle-read-twice: the transpose's output has another reader than the cast
    assert not _run_pass("casts_before_movement", n) and _kinds(n) == kinds
