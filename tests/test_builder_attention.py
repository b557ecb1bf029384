"""attention_from_matmuls: attention written by hand (matmul, scale, bias, softmax, matmul) becomes one attention
layer, with the written-out form's NaN rows where a bias row blocks every key, and is left alone where the match
fails. Compared with eager PyTorch on real numbers (fp32: 1e-4 * max|ref|), NaN positions exactly."""
import pytest
import torch
from torch import nn

import torchkiln
from torchkiln.builder import BuildSettings
from torchkiln.builder.pipeline import PASSES
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.engine import Engine, InputBinding

F32 = torch.float32
E = L.ElementWiseOperation


def _bindings(net):
    return [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in net.inputs]


def _hand_attention(bias=None, scale=0.125, transposed_by_shuffle=True, probs_out=False):
    """softmax(q @ k^T * scale + bias) @ v over inputs q, k, v (and an input bias, or a constant one)."""
    n = Network()
    q, k, v = (n.add_input(name, F32, (2, 3, 5, 8)) for name in "qkv")
    if transposed_by_shuffle:
        kt = n.add_shuffle(k, first_transpose=(0, 1, 3, 2)).get_output()
        scores = n.add_matrix_multiply(q, L.MatrixOperation.NONE, kt, L.MatrixOperation.NONE).get_output()
    else:
        scores = n.add_matrix_multiply(q, L.MatrixOperation.NONE, k, L.MatrixOperation.TRANSPOSE).get_output()
    if scale is not None:
        scores = n.add_elementwise(scores, n.add_constant(torch.tensor(scale)).get_output(), E.PROD).get_output()
    if isinstance(bias, torch.Tensor):
        scores = n.add_elementwise(n.add_constant(bias).get_output(), scores, E.SUM).get_output()
    elif bias is not None:
        scores = n.add_elementwise(scores, n.add_input("bias", F32, bias), E.SUM).get_output()
    probs = n.add_softmax(scores, axis=3).get_output()
    n.mark_output(n.add_matrix_multiply(probs, L.MatrixOperation.NONE, v, L.MatrixOperation.NONE).get_output())
    if probs_out:
        n.mark_output(probs)
    return n


def _inputs(net, blocked_row=True):
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(t.shape, generator=gen) for t in net.inputs]
    if len(values) == 4:  # a padding mask with -inf, one row blocking every key, one +inf and one NaN
        bias = torch.zeros(values[3].shape)
        bias[..., 3:] = float("-inf")
        if blocked_row and bias.shape[-2] == 1:  # a padding mask: every key of sequence 1 blocked
            bias[1] = float("-inf")
        elif blocked_row:
            bias[1, ..., 1, :] = float("-inf")
            bias[0, ..., 2, 0] = float("inf")
            bias[0, ..., 4, 1] = float("nan")
        values[3] = bias
    return values


def _run(net, values):
    return Engine(net, _bindings(net), "cpu", F32).execute(values)


def _assert_same(got, ref):
    assert torch.equal(got.isnan(), ref.isnan())
    finite = ~ref.isnan()
    assert (got[finite] - ref[finite]).abs().max() <= 1e-4 * ref[finite].abs().max()


@pytest.mark.parametrize("bias_shape", [None, (2, 1, 5, 5), (2, 1, 1, 5)], ids=["no-bias", "rows", "padding"])
@pytest.mark.parametrize("transposed_by_shuffle", [True, False], ids=["shuffle", "op1"])
def test_hand_attention_becomes_one_layer_with_the_written_out_values(bias_shape, transposed_by_shuffle):
    net = _hand_attention(bias_shape, transposed_by_shuffle=transposed_by_shuffle)
    values = _inputs(net)
    before = _run(net, values)[0]
    if bias_shape == (2, 1, 5, 5):
        assert before.isnan().any() and (~before.isnan()).any()  # the blocked, +inf and NaN rows are NaN
    assert PASSES["attention_from_matmuls"](net, BuildSettings())
    PASSES["remove_dead_layers"](net, BuildSettings())
    kinds = [x.KIND for x in net.layers]
    assert kinds.count("attention") == 1 and "softmax" not in kinds and "matrix_multiply" not in kinds
    attention = next(x for x in net.layers if x.KIND == "attention")
    assert attention.scale == pytest.approx(0.125)
    assert ("select" in kinds) == (bias_shape is not None)  # an input bias: its rows are checked at run time
    _assert_same(_run(net, values)[0], before)


def test_a_constant_bias_is_checked_once():
    """A finite constant bias (a position bias) adds nothing; one with a blocked row adds a constant row mask."""
    finite = torch.randn(1, 3, 5, 5)
    net = _hand_attention(finite, scale=None)
    values = _inputs(net)
    before = _run(net, values)[0]
    assert PASSES["attention_from_matmuls"](net, BuildSettings())
    PASSES["remove_dead_layers"](net, BuildSettings())
    assert [x.KIND for x in net.layers if x.KIND != "constant"] == ["attention"]
    assert net.layers[-1].scale == 1.0
    _assert_same(_run(net, values)[0], before)
    blocked = finite.clone()
    blocked[0, 1, 2] = float("-inf")
    net = _hand_attention(blocked, scale=None)
    before = _run(net, values)[0]
    assert before.isnan().any()
    assert PASSES["attention_from_matmuls"](net, BuildSettings())
    PASSES["remove_dead_layers"](net, BuildSettings())
    assert [x.KIND for x in net.layers if x.KIND != "constant"] == ["attention", "select"]
    _assert_same(_run(net, values)[0], before)


def test_probabilities_read_elsewhere_stay_written_out():
    net = _hand_attention((2, 1, 5, 5), probs_out=True)
    kinds = [x.KIND for x in net.layers]
    assert not PASSES["attention_from_matmuls"](net, BuildSettings())
    assert [x.KIND for x in net.layers] == kinds


class _Block(nn.Module):
    """Projections, heads, softmax(q k^T / sqrt(d) + mask) v, as encoders write it by hand."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5 + mask
        return self.out((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_a_hand_written_encoder_block_compiles_to_attention_and_matches_eager(backend):
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 1, 1, 6)
    mask[1, ..., 4:] = float("-inf")
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input.from_tensor(t) for t in (x, mask)],
                                              backend=backend)
    kinds = [x.KIND for x in Engine.deserialize(data).network.layers]
    assert kinds.count("attention") == 1 and "softmax" not in kinds
    compiled = torchkiln.compile(model, inputs=[x, mask], backend=backend, min_block_size=1)
    with torch.no_grad():
        ref = model(x, mask)
    for blocked in (False, True):
        if blocked:  # every key of sequence 0 blocked: eager's rows are NaN, and so are the engine's
            mask[0] = float("-inf")
            with torch.no_grad():
                ref = model(x, mask)
            assert ref[0].isnan().all() and not ref[1].isnan().any()
        _assert_same(compiled(x, mask), ref)


def test_a_softmax_widened_to_float32_and_cast_back_is_matched():
    """softmax(scores.float()).type_as(scores) in float16 (T5's form): one float16 attention layer, against the
    float32 written-out values (cosine >= 0.999, max abs error <= 1e-2 * max|ref|)."""
    n = Network()
    q, k, v = (n.add_input(name, torch.float16, (2, 3, 5, 8)) for name in "qkv")
    bias = n.add_input("bias", torch.float16, (1, 3, 5, 5))
    scores = n.add_matrix_multiply(q, L.MatrixOperation.NONE, k, L.MatrixOperation.TRANSPOSE).get_output()
    wide = n.add_cast(n.add_elementwise(scores, bias, E.SUM).get_output(), F32).get_output()
    probs = n.add_cast(n.add_softmax(wide, axis=3).get_output(), torch.float16).get_output()
    n.mark_output(n.add_matrix_multiply(probs, L.MatrixOperation.NONE, v, L.MatrixOperation.NONE).get_output())
    values = [x.half() for x in _inputs(_hand_attention((1, 3, 5, 5)), blocked_row=False)]
    exact = torch.softmax(values[0].float() @ values[1].float().transpose(-1, -2) + values[3].float(), -1) \
        @ values[2].float()
    assert PASSES["attention_from_matmuls"](n, BuildSettings())
    PASSES["remove_dead_layers"](n, BuildSettings())
    assert [x.KIND for x in n.layers if x.KIND not in ("constant",)] == ["attention", "reduce", "elementwise",
                                                                         "elementwise", "elementwise", "select"]
    got = Engine(n, _bindings(n), "cpu", torch.float16).execute(values)[0].float()
    assert torch.nn.functional.cosine_similarity(got.flatten(), exact.flatten(), dim=0) >= 0.999
    assert (got - exact).abs().max() <= 1e-2 * exact.abs().max()


class _Windows(nn.Module):
    """Shifted-window attention as torchvision's Swin writes it: q scaled, a relative position bias per head, then
    the scores viewed per window to add each window's mask (-100 between regions, a constant), viewed back."""

    def __init__(self, windows=4, heads=3, length=9):
        super().__init__()
        self.windows, self.heads = windows, heads
        self.position_bias = nn.Parameter(torch.randn(heads, length, length))
        mask = torch.zeros(windows, length, length)
        mask[1:, :4, 4:] = -100.0
        mask[1:, 4:, :4] = -100.0
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        attn = (q * 0.25) @ k.transpose(-2, -1) + self.position_bias.unsqueeze(0)
        n, length = q.shape[0], q.shape[2]
        attn = attn.view(n // self.windows, self.windows, self.heads, length, length) + self.mask.unsqueeze(1)[None]
        attn = attn.view(-1, self.heads, length, length)
        return torch.softmax(attn, dim=-1) @ v


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_shifted_window_attention_is_regrouped_into_one_attention_layer(backend):
    """q, k, v [B * W, H, L, d] regrouped to [B, W * H, L, d], one constant bias holding the position bias and the
    windows' mask; the result viewed back matches eager."""
    torch.manual_seed(0)
    attention = _one_attention_layer(_Windows().eval(), [torch.randn(8, 3, 9, 16) for _ in range(3)], backend)
    assert [list(t.shape) for t in attention.inputs] == [[2, 12, 9, 16]] * 3 + [[1, 12, 9, 9]]


def _one_attention_layer(model, inputs, backend):
    """The one attention layer `model`'s engine has (no softmax or matrix multiply left), after checking that
    the compiled model matches eager."""
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input.from_tensor(t) for t in inputs],
                                              backend=backend)
    layers = Engine.deserialize(data).network.layers
    kinds = [x.KIND for x in layers]
    assert kinds.count("attention") == 1 and "softmax" not in kinds and "matrix_multiply" not in kinds
    compiled = torchkiln.compile(model, inputs=inputs, backend=backend, min_block_size=1)
    with torch.no_grad():
        _assert_same(compiled(*inputs), model(*inputs))
    return next(x for x in layers if x.KIND == "attention")


class _Grouped(nn.Module):
    """Attention within groups as torchvision's MaxViT writes it: 5-D [B, G, H, P, d] heads, scores by einsum,
    a bias broadcast over them (per head: a relative position bias; per group: a mask), softmax, einsum."""

    def __init__(self, bias_shape):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(bias_shape)) if bias_shape else None

    def forward(self, q, k, v):
        scores = torch.einsum("B G H I D, B G H J D -> B G H I J", q, k * 0.25)
        if self.bias is not None:
            scores = scores + self.bias
        return torch.einsum("B G H I J, B G H J D -> B G H I D", torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("bias_shape,groups", [
    (None, [6, 2]), ((2, 7, 7), [6, 2]), ((1, 2, 7, 7), [6, 2]), ((3, 1, 7, 7), [2, 6]),
    ((2, 3, 2, 7, 7), [1, 12]), ((3, 2, 1, 7), [2, 6]),
], ids=["none", "per-head", "per-head-4d", "per-group", "full", "per-group-head-row"])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_grouped_5d_attention_is_regrouped_into_one_attention_layer(bias_shape, groups, backend):
    """q, k, v [B, G, H, L, d] regrouped to [N1, N2, L, d], N2 the leading dims the bias varies along (the heads at
    least); the bias expanded and reshaped to [1, N2, L, S], a constant whose rows are checked at build (no row
    check left to run); the result viewed back matches eager."""
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, 2, 7, 8) for _ in range(3)]
    attention = _one_attention_layer(_Grouped(bias_shape).eval(), inputs, backend)
    assert [list(t.shape) for t in attention.inputs[:3]] == [groups + [7, 8]] * 3
    if bias_shape is not None:
        assert isinstance(attention.inputs[3].producer, L.ConstantLayer)


class _GroupedInputBias(nn.Module):
    def forward(self, q, k, v, bias):
        return torch.softmax(q @ k.transpose(-2, -1) + bias, dim=-1) @ v


def test_grouped_5d_attention_with_a_runtime_bias_keeps_its_blocked_rows():
    """A bias input (not a constant) per group: expanded at run time; a row it blocks entirely is NaN, as written."""
    model = _GroupedInputBias().eval()
    q, k, v = (torch.randn(2, 3, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    bias = torch.randn(3, 1, 5, 5)
    bias[1, 0, 2] = float("-inf")
    inputs = [torchkiln.Input.from_tensor(t) for t in (q, k, v, bias)]
    data = torchkiln.convert_method_to_engine(model, "forward", inputs)
    assert [x.KIND for x in Engine.deserialize(data).network.layers].count("attention") == 1
    compiled = torchkiln.compile(model, inputs=[q, k, v, bias], min_block_size=1)
    with torch.no_grad():
        ref = model(q, k, v, bias)
    assert ref.isnan().any() and not ref.isnan().all()
    _assert_same(compiled(q, k, v, bias), ref)


class _CosineWindows(nn.Module):
    """Swin V2's window attention: cosine scores times a per-head logit scale (a tensor [H, 1, 1]), a relative
    position bias from a small MLP over a coordinate table, the shifted windows' mask through a 5-D view."""

    def __init__(self, shifted, windows=4, heads=3, length=9):
        super().__init__()
        self.shifted, self.windows, self.heads, self.length = shifted, windows, heads, length
        self.logit_scale = nn.Parameter(torch.log(10 * torch.rand(heads, 1, 1) + 1))
        self.mlp = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, heads, bias=False))
        self.register_buffer("table", torch.randn(5, 5, 2))
        self.register_buffer("index", torch.randint(0, 25, (length * length,)))
        mask = torch.zeros(windows, length, length)
        mask[1:, :4, 4:] = -100.0
        mask[1:, 4:, :4] = -100.0
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        attn = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(self.logit_scale, max=4.6052).exp()
        bias = self.mlp(self.table).view(-1, self.heads)[self.index].view(self.length, self.length, -1)
        attn = attn + 16 * torch.sigmoid(bias.permute(2, 0, 1)).unsqueeze(0)
        if self.shifted:
            n = q.shape[0]
            attn = attn.view(n // self.windows, self.windows, self.heads, self.length, self.length)
            attn = (attn + self.mask.unsqueeze(1).unsqueeze(0)).view(-1, self.heads, self.length, self.length)
        return torch.softmax(attn, dim=-1) @ v


@pytest.mark.parametrize("shifted", [False, True], ids=["windows", "shifted-windows"])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_cosine_attention_with_a_per_head_logit_scale_is_one_attention_layer(shifted, backend):
    """The per-head scale multiplies q instead of the scores; the rest is as written."""
    torch.manual_seed(0)
    model = _CosineWindows(shifted).eval()
    q, k, v = (torch.randn(8, 3, 9, 16) for _ in range(3))
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input.from_tensor(t) for t in (q, k, v)],
                                              backend=backend)
    kinds = [x.KIND for x in Engine.deserialize(data).network.layers]
    assert kinds.count("attention") == 1 and "softmax" not in kinds and "matrix_multiply" not in kinds
    compiled = torchkiln.compile(model, inputs=[q, k, v], backend=backend, min_block_size=1)
    with torch.no_grad():
        _assert_same(compiled(q, k, v), model(q, k, v))


def test_a_multiplier_varying_along_the_keys_stays_written_out():
    """(q @ k^T) * m with m varying along the keys is not a scale of q's rows: the softmax stays."""
    net = Network()
    q, k, v = (net.add_input(name, F32, (2, 3, 5, 8)) for name in "qkv")
    scores = net.add_matrix_multiply(q, L.MatrixOperation.NONE, k, L.MatrixOperation.TRANSPOSE).get_output()
    scaled = net.add_elementwise(scores, net.add_constant(torch.rand(1, 3, 1, 5)).get_output(), E.PROD).get_output()
    probs = net.add_softmax(scaled, axis=3).get_output()
    net.mark_output(net.add_matrix_multiply(probs, L.MatrixOperation.NONE, v, L.MatrixOperation.NONE).get_output())
    assert not PASSES["attention_from_matmuls"](net, BuildSettings())
