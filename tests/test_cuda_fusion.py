"""The CUDA planner's fusion rules (runtime/backends/cuda/fusion.py) on generic blocks: how many steps each block
becomes, which layers stay apart and why, and that the planned steps (generated kernels in Triton's interpreter on
a machine without CUDA) compute what eager PyTorch does: fp32, |err| <= 1e-4 * max|eager|."""
import logging

import pytest
import torch
from torch import nn

pytest.importorskip("triton", reason="triton is not installed")

import torchkiln  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import fusion, planner  # noqa: E402
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV  # noqa: E402
from torchkiln.runtime.backends.cuda.kernels import CHANNELS_LAST_OUT  # noqa: E402
from torchkiln.runtime.backends.cuda.runner import bind_steps, channels_last_inputs, place_weights  # noqa: E402
from torchkiln.runtime.engine import Engine  # noqa: E402
from torchkiln.runtime.symbols import SymbolBinder  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN and inf in the interpreter


@pytest.fixture(scope="module", autouse=True)
def interpreter(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("torchkiln-cache")))
        yield


class RMSNormSwiGLU(nn.Module):
    """A decoder-only LLM's MLP sublayer: x + down(silu(gate(rms(x))) * up(rms(x)))."""

    def __init__(self, d: int = 32, hidden: int = 48) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)
        self.gate, self.up, self.down = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False), \
            nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class HandAttention(nn.Module):
    """Attention written by hand: softmax(q k^T * scale + mask) v."""

    def forward(self, q, k, v, mask):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125 + mask, dim=-1) @ v


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c))

    def forward(self, x):
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(h)))) * self.gamma
        return x + h.permute(0, 3, 1, 2)


def network(module: nn.Module, *shapes) -> Network:
    data = torchkiln.convert_method_to_engine(module.eval(), "forward", [torchkiln.Input(s) for s in shapes],
                                              backend="reference")
    return Engine.deserialize(data).network


def planned(net: Network, inputs: list[torch.Tensor]):
    plan = planner.make_plan(net, DEVICE, BackendOptions(timing_iterations=0))
    bound = bind_steps(net, plan, place_weights(net, plan, DEVICE), SymbolBinder.for_network(net),
                       [tuple(x.shape) for x in inputs], DEVICE, allow_tf32=False)
    steps = [(plan.kernels[s.kernel].op, [net.layers[j].KIND for j in s.layers]) for s in plan.steps]
    return steps, bound.run_eagerly([x.to(DEVICE) for x in inputs])


def assert_matches(got: torch.Tensor, ref: torch.Tensor) -> None:
    got, ref = got.cpu(), ref.cpu()
    assert got.shape == ref.shape and torch.equal(got.isnan(), ref.isnan())
    finite = ref.isfinite()
    scale = ref[finite].abs().max().item()
    assert scale > 0 and (got[finite] - ref[finite]).abs().max().item() <= 1e-4 * scale


def rows(steps):
    return [kinds for op, kinds in steps if op == "rows"]


def test_rms_norm_is_one_kernel_and_the_swiglu_product_another():
    module = RMSNormSwiGLU()
    x = torch.randn(2, 5, 32)
    steps, got = planned(network(module, (2, 5, 32)), [x])
    assert len(rows(steps)) == 1 and "reduce" in rows(steps)[0]
    assert ("pointwise", ["activation", "elementwise"]) in steps  # silu(gate) * up
    assert sum(op in ("rows", "pointwise") for op, _ in steps) == 3  # rms norm; silu * up; the residual add
    assert_matches(got[0], module(x))


def test_hand_attention_is_one_attention_call_with_eager_nan_rows():
    """Products, scale, mask and softmax are one attention call (builder pass attention_from_matmuls); the mask's
    row check (one reduction kernel) and a generated select give eager's NaN rows where the mask blocks every key
    (all -inf), and a partly masked row matches."""
    mask = torch.zeros(2, 1, 1, 9)
    mask[1, ..., 5:] = float("-inf")
    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    steps, got = planned(network(HandAttention(), (2, 3, 6, 8), (2, 3, 9, 8), (2, 3, 9, 8), (2, 1, 1, 9)),
                         [q, k, v, mask])
    assert [op for op, _ in steps if op != "constant"] == ["attention", "rows", "pointwise"]
    assert_matches(got[0], HandAttention()(q, k, v, mask))
    mask[0, ..., :] = float("-inf")
    steps, got = planned(network(HandAttention(), (2, 3, 6, 8), (2, 3, 9, 8), (2, 3, 9, 8), (2, 1, 1, 9)),
                         [q, k, v, mask])
    ref = HandAttention()(q, k, v, mask)
    assert bool(ref[0].isnan().all()) and torch.equal(got[0].cpu().isnan(), ref.isnan())


def test_a_normalize_is_one_kernel_with_its_division():
    """F.normalize divides by the norm expanded to the input's shape (`expand_as`); the division reads the norm
    itself (builder pass broadcasts_for_expands), so the norm, its clamp and the division (and the scale after
    it) are one row kernel, not a row kernel, an expand and a pointwise pass."""
    class Normalized(nn.Module):
        def forward(self, q):
            return torch.nn.functional.normalize(q, dim=-1) * 0.5

    q = torch.randn(2, 3, 4, 21)
    steps, got = planned(network(Normalized(), (2, 3, 4, 21)), [q])
    assert [op for op, _ in steps if op not in ("constant", "shuffle")] == ["rows"]
    assert_matches(got[0], Normalized()(q))


def test_masked_fill_and_softmax_are_one_kernel():
    """scores.masked_fill(~keep, -inf) -> softmax (attention masks written with masked_fill)."""
    class Masked(nn.Module):
        def forward(self, scores, keep):
            return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)

    scores, keep = torch.randn(2, 3, 5, 7), torch.rand(2, 1, 1, 7) > 0.3
    keep[..., 0] = True
    data = torchkiln.convert_method_to_engine(Masked().eval(), "forward", [
        torchkiln.Input((2, 3, 5, 7)), torchkiln.Input((2, 1, 1, 7), dtype=torch.bool)], backend="reference")
    net = Engine.deserialize(data).network
    steps, got = planned(net, [scores, keep])
    assert [op for op, _ in steps if op != "constant"] == ["rows"] and "select" in rows(steps)[0]
    assert_matches(got[0], Masked()(scores, keep))


def test_convnext_block_norm_is_one_kernel_over_the_permuted_view():
    module = ConvNeXtBlock()
    x = torch.randn(2, 16, 6, 6)
    steps, got = planned(network(module, (2, 16, 6, 6)), [x])
    normed = [(op, kinds) for op, kinds in steps if "normalization" in kinds]  # with the depthwise bias, over the view
    assert len(normed) == 1 and normed[0][0] == "conv_epilogue" and normed[0][1][:2] == ["convolution", "shuffle"]
    assert_matches(got[0], module(x))


class GlobalResponseNorm(nn.Module):
    """ConvNeXt V2's MLP on [N, H, W, C] activations: up-projection, GELU, GRN (an L2 norm over the spatial dims,
    middle axes), down-projection."""

    def __init__(self, c: int = 12) -> None:  # (more than 8 products an output: library products)
        super().__init__()
        self.up, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.weight, self.bias = nn.Parameter(torch.randn(4 * c)), nn.Parameter(torch.randn(4 * c))

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x))
        g = torch.linalg.vector_norm(h, ord=2, dim=(1, 2), keepdim=True)
        h = self.weight * (h * (g / (g.mean(dim=-1, keepdim=True) + 1e-6))) + self.bias + h
        return self.down(h)


def test_a_norm_over_middle_axes_is_generated_with_its_prologue():
    """GRN's sum of squares over H and W is a row kernel over (sample, channel) rows with the GELU and square
    before it and the square root after it; the mean over channels and the division are a second (rows of
    [N, 1, 1, C]); the GELU is computed again by the last pointwise pass rather than written (rule 4b)."""
    module = GlobalResponseNorm()
    x = torch.randn(2, 5, 6, 12)
    steps, got = planned(network(module, (2, 5, 6, 12)), [x])
    assert rows(steps) == [["activation", "unary", "reduce", "unary"], ["reduce", "elementwise", "elementwise"]]
    assert [op for op, _ in steps if op != "constant"] == ["matrix_multiply", "rows", "rows", "pointwise",
                                                           "matrix_multiply"]
    assert_matches(got[0], module(x))


class SiblingReductions(nn.Module):
    """Reductions of one input computed apart: its softmax along the tokens, its mean and its sum over them; and a
    channel gate from the average and the max over the spatial dims (two reductions of one feature map)."""

    def forward(self, x, f):
        tokens = torch.softmax(x, dim=1) * x.mean(1, keepdim=True) + x.sum(1, keepdim=True).abs().sqrt()
        gate = torch.sigmoid(f.mean((2, 3), keepdim=True) + f.amax((2, 3), keepdim=True))
        return tokens, gate


def test_sibling_reductions_of_one_input_are_one_kernel():
    """Reductions over the same space and axes that read the same input join one row kernel with the pointwise
    work between them: one pass over each input instead of one a reduction."""
    module = SiblingReductions()
    x, f = torch.rand(2, 5, 8) + 0.1, torch.randn(2, 6, 4, 4)
    steps, got = planned(network(module, (2, 5, 8), (2, 6, 4, 4)), [x, f])
    assert [op for op, _ in steps if op != "constant"] == ["rows", "rows"]
    assert sorted(kinds.count("reduce") + kinds.count("softmax") for kinds in rows(steps)) == [2, 3]
    for g, r in zip(got, module(x, f)):
        assert_matches(g, r)


def test_group_norm_and_silu_are_one_kernel():
    from torchkiln.examples.blocks import GroupNormResBlock

    module = GroupNormResBlock(16, 4)
    with torch.no_grad():
        for norm in (module.norm1, module.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 16, 6, 6)
    net = network(module, (2, 16, 6, 6))
    steps, got = planned(net, [x])
    normed = [kinds for op, kinds in steps if "normalization" in kinds]
    assert len(normed) == 2 and all(len(kinds) >= 2 for kinds in normed)
    assert [op for op, kinds in steps if "normalization" in kinds] == ["rows", "conv_epilogue"]  # conv1's bias joins
    assert_matches(got[0], module(x))
    # the first norm's row step, read only by conv1 (channels-last), writes channels-last (the second norm is in
    # conv1's epilogue step); the runner takes the input as it comes (no convolution reads it: the norm's rows are
    # contiguous in NCHW)
    plan = planner.make_plan(net, DEVICE, BackendOptions(timing_iterations=0))
    assert [bool(plan.kernels[s.kernel].option(CHANNELS_LAST_OUT)) for s in plan.steps
            if plan.kernels[s.kernel].op == "rows"] == [True]
    assert channels_last_inputs(net, plan) == [False]
    # with a dynamic batch the row kernel's sizes are run-time values, with which channels-last stores scatter: the
    # norm keeps its input's layout
    data = torchkiln.convert_method_to_engine(module.eval(), "forward", [torchkiln.Input(
        min_shape=(1, 16, 6, 6), opt_shape=(2, 16, 6, 6), max_shape=(4, 16, 6, 6))], backend="reference")
    dynamic = Engine.deserialize(data).network
    plan = planner.make_plan(dynamic, DEVICE, BackendOptions(timing_iterations=0))
    assert [bool(plan.kernels[s.kernel].option(CHANNELS_LAST_OUT)) for s in plan.steps
            if plan.kernels[s.kernel].op == "rows"] == [False]


def test_pointwise_outputs_read_by_channels_last_convolutions_are_written_channels_last():
    """silu(x) * 2 -> conv: the pointwise step writes channels-last; silu(x) -> conv and an output: contiguous."""
    class Block(nn.Module):
        def __init__(self, returns_act: bool) -> None:
            super().__init__()
            self.conv, self.returns_act = nn.Conv2d(8, 8, 3, padding=1), returns_act

        def forward(self, x):
            a = torch.nn.functional.silu(x) * 2
            return (self.conv(a), a) if self.returns_act else self.conv(a)

    for returns_act, expected in ((False, True), (True, False)):
        module, x = Block(returns_act).eval(), torch.randn(2, 8, 5, 5)
        net = network(module, (2, 8, 5, 5))
        plan = planner.make_plan(net, DEVICE, BackendOptions(timing_iterations=0))
        assert [bool(plan.kernels[s.kernel].option(CHANNELS_LAST_OUT)) for s in plan.steps
                if plan.kernels[s.kernel].op == "pointwise"] == [expected]
        assert channels_last_inputs(net, plan) == [False]  # only a generated step reads it
        steps, got = planned(net, [x])
        want = module(x)
        for g, w in zip(got, want if returns_act else [want]):
            assert_matches(g, w)


def test_a_value_read_by_a_convolution_and_as_the_residual_of_its_epilogue_is_written_channels_last():
    """Windows merged back into tokens, a residual added, the tokens viewed as an image and x + conv(x) (a
    positional convolution): the indexed step making the image writes it channels-last, for the convolution and for
    the residual its epilogue adds; read also by another generated step, it stays contiguous."""
    class Block(nn.Module):
        def __init__(self, also: bool) -> None:
            super().__init__()
            self.conv, self.also = nn.Conv2d(8, 8, 3, padding=1, groups=8), also

        def forward(self, w, s):
            x = s + w.view(2, 2, 2, 2, 2, 8).permute(0, 1, 3, 2, 4, 5).reshape(2, 16, 8)
            img = x.transpose(1, 2).reshape(2, 8, 4, 4)
            y = img + self.conv(img)
            return (y, torch.sigmoid(img)) if self.also else y

    w, s = torch.randn(8, 4, 8), torch.randn(2, 16, 8)
    for also, expected in ((False, True), (True, False)):
        module = Block(also).eval()
        net = network(module, (8, 4, 8), (2, 16, 8))
        plan = planner.make_plan(net, DEVICE, BackendOptions(timing_iterations=0))
        [indexed] = [plan.kernels[s.kernel] for s in plan.steps if plan.kernels[s.kernel].op == "indexed"]
        assert bool(indexed.option(CHANNELS_LAST_OUT)) == expected
        steps, got = planned(net, [w, s])
        want = module(w, s)
        for g, r in zip(got, want if also else [want]):
            assert_matches(g, r)


def test_an_input_a_channels_last_convolution_reads_is_taken_channels_last():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return self.conv(x) + x * 2

    net = network(Block().eval(), (2, 8, 5, 5))
    plan = planner.make_plan(net, DEVICE, BackendOptions(timing_iterations=0))
    assert channels_last_inputs(net, plan) == [True]


class WindowLinear(nn.Module):
    """A projection of 4x4 windows of a [B, H, W, C] map (Twins' and Swin's partitions): the linear reads a
    transposed 6-D view."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(c, 3 * c)

    def forward(self, x):
        b, h, w, c = x.shape
        windows = x.reshape(b, h // 4, 4, w // 4, 4, c).transpose(2, 3)
        return self.qkv(windows * 2.0)


@pytest.mark.parametrize("channels, fused", [(64, True), (16, False)])
def test_a_linear_of_a_transposed_view_adds_its_bias_in_the_product(channels, fused):
    """One GEMM with the bias in its epilogue (addmm), not ATen linear's batched product and a bias pass; a
    product narrower than the library's tiles keeps ATen's path (kernels.MIN_FLATTENED_WIDTH)."""
    module, x = WindowLinear(channels).eval(), torch.randn(2, 8, 8, channels)
    net = network(module, tuple(x.shape))
    with torch.profiler.profile() as prof:
        _, got = planned(net, [x])
    ops = {e.key for e in prof.key_averages()}
    assert ("aten::addmm" in ops and "aten::add_" not in ops) == fused, sorted(o for o in ops if "aten::" in o)
    with torch.no_grad():
        assert_matches(got[0], module(x))


class WindowHeads(nn.Module):
    """Attention over [batch, windows, heads, tokens, dim] (Twins' locally-grouped attention)."""

    def forward(self, qkv):
        b, g, n, _ = qkv.shape
        q, k, v = qkv.reshape(b, g, n, 3, 2, 8).permute(3, 0, 1, 4, 2, 5).unbind(0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_attention_over_more_than_four_dims_merges_them_for_the_fused_kernels():
    """SDPA's fused kernels take 4-D inputs: windows and batch are merged (a view here), not left to the math
    backend, which copies the operands and materializes the scores."""
    module, qkv = WindowHeads().eval(), torch.randn(2, 3, 16, 48)
    net = network(module, (2, 3, 16, 48))
    with torch.profiler.profile() as prof:
        steps, got = planned(net, [qkv])
    assert [op for op, _ in steps if op == "attention"] == ["attention"]
    ops = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" not in ops, sorted(o for o in ops if "attention" in o)
    assert_matches(got[0], module(qkv))


class TalkingHeads(nn.Module):
    """CaiT's talking-heads attention: a linear across the heads before and after the softmax, over the scores
    permuted to [B, N, N, heads]."""

    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.before, self.after = nn.Linear(heads, heads), nn.Linear(heads, heads)

    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) * 0.25  # (16 products an output: a library call)
        s = self.before(s.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(-1)
        return self.after(s.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) @ v


def test_a_linear_across_few_heads_is_index_arithmetic_with_its_permutes():
    """Each 4-wide linear with the permutes around it is one generated indexed kernel (rule 8b): no copy of the
    permuted scores and no library GEMM of 4 columns; the products stay library calls."""
    module = TalkingHeads().eval()
    q, k, v = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    net = network(module, *(tuple(t.shape) for t in (q, k, v)))
    steps, got = planned(net, [q, k, v])
    indexed = [kinds for op, kinds in steps if op == "indexed"]
    assert len(indexed) == 2 and all("matrix_multiply" in kinds and "shuffle" in kinds for kinds in indexed), steps
    assert [op for op, _ in steps if op == "matrix_multiply"] == ["matrix_multiply"] * 2, steps
    with torch.no_grad():
        assert_matches(got[0], module(q, k, v))


@pytest.mark.parametrize("ops", [("none", "none"), ("transpose", "none"), ("none", "transpose"),
                                 ("transpose", "transpose")])
def test_small_products_match_eager_for_every_operand_orientation(ops):
    """A product of 3 positions summed an output, batched and broadcast (a [2, 1, 5, 3] by a [4, 3, 6]), each operand
    taken as is or transposed, with a bias: the indexed kernel's unrolled sum against torch.matmul."""
    net = Network("small")
    shape_a = (2, 1, 5, 3) if ops[0] == "none" else (2, 1, 3, 5)
    shape_b = (4, 3, 6) if ops[1] == "none" else (4, 6, 3)
    a, b = net.add_input("a", torch.float32, shape_a), net.add_input("b", torch.float32, shape_b)
    layer = net.add_matrix_multiply(a, L.MatrixOperation(ops[0]), b, L.MatrixOperation(ops[1]))
    bias = torch.randn(6)
    layer.weights["bias"] = bias
    net.mark_output(layer.get_output())
    xa, xb = torch.randn(shape_a), torch.randn(shape_b)
    steps, got = planned(net, [xa, xb])
    assert [op for op, _ in steps] == ["indexed"], steps
    ta = xa.transpose(-1, -2) if ops[0] == "transpose" else xa
    tb = xb.transpose(-1, -2) if ops[1] == "transpose" else xb
    assert_matches(got[0], torch.matmul(ta, tb) + bias)


def test_a_product_of_no_terms_stays_a_library_call():
    """[2, 3, 0] @ [2, 0, 4] + bias sums no products: the indexed generator refuses it (its unrolled sum would be
    empty) and the library call gives the bias."""
    net = Network("empty")
    a, b = net.add_input("a", torch.float32, (2, 3, 0)), net.add_input("b", torch.float32, (2, 0, 4))
    layer = net.add_matrix_multiply(a, L.MatrixOperation.NONE, b, L.MatrixOperation.NONE)
    layer.weights["bias"] = torch.arange(4.0) + 1
    net.mark_output(layer.get_output())
    steps, got = planned(net, [torch.randn(2, 3, 0), torch.randn(2, 0, 4)])
    assert [op for op, _ in steps] == ["matrix_multiply"], steps
    assert torch.equal(got[0].cpu(), (torch.arange(4.0) + 1).expand(2, 3, 4))


def test_classes():
    net = Network("classes")
    x = net.add_input("x", torch.float32, (2, 8))
    layers = [net.add_unary(x, L.UnaryOperation.EXP), net.add_softmax(x, 1), net.add_softmax(x, 0),
              net.add_reduce(x, L.ReduceOperation.PROD, (1,), True), net.add_shuffle(x, reshape_dims=(8, 2)),
              net.add_matrix_multiply(x, L.MatrixOperation.NONE, x, L.MatrixOperation.TRANSPOSE),
              net.add_topk(x, L.TopKOperation.MAX, 2, 1)]
    assert [fusion.classify(layer) for layer in layers] == [
        fusion.OpClass.POINTWISE, fusion.OpClass.REDUCTION, fusion.OpClass.REDUCTION, fusion.OpClass.OPAQUE,
        fusion.OpClass.VIEW, fusion.OpClass.LIBRARY, fusion.OpClass.OPAQUE]


def test_refused_joins_are_logged_with_their_reason(caplog):
    """softmax(x) * y where y is made after the softmax (a later product): the multiply cannot join the group,
    which runs at its first layer; a reduction over other axes has a group of its own."""
    net = Network("late")
    x = net.add_input("x", torch.float32, (4, 8))
    s = net.add_softmax(x, 1).get_output()
    y = net.add_matrix_multiply(x, L.MatrixOperation.NONE, net.add_constant(torch.randn(8, 8)).get_output(),
                                L.MatrixOperation.NONE).get_output()
    net.mark_output(net.add_elementwise(s, y, L.ElementWiseOperation.PROD).get_output())
    net.mark_output(net.add_reduce(s, L.ReduceOperation.SUM, (0,), False).get_output())
    with caplog.at_level(logging.DEBUG, logger=fusion.__name__):
        groups = fusion.row_groups(net)
    assert groups == [[0], [4]]
    assert "elementwise 'elementwise' stays out of the row group of 'softmax': the group would read " \
        "['matrix_multiply:0'] before they are made" in caplog.text
    assert "reduce 'reduce' stays out of the row group of 'softmax': it reduces another space ([4, 8], axes [0])" \
        in caplog.text


def _blocks():
    from torchkiln.examples import blocks as B

    return {
        "rmsnorm-swiglu": (B.RMSNormSwiGLU(32, 48), (2, 8, 32),
                           ["rows", "linear_group", "pointwise", "matrix_multiply", "pointwise"]),
        "groupnorm-resblock": (B.GroupNormResBlock(16, 4), (2, 16, 8, 8),
                               ["rows", "conv_epilogue", "conv_epilogue"]),
        "squeeze-excite": (B.SqueezeExcite(16, 4), (2, 16, 6, 6),
                           ["rows", "conv_epilogue", "conv_epilogue", "pointwise"]),
        "layernorm-mlp": (B.LayerNormGeLUMLP(32), (2, 5, 32),
                          ["rows", "matrix_multiply", "pointwise", "matrix_multiply", "pointwise"]),
        "tanh-gelu-mlp": (B.TanhGeluMLP(32), (2, 5, 32),
                          ["matrix_multiply", "pointwise", "matrix_multiply", "pointwise"]),
    }


@pytest.mark.parametrize("name", ["rmsnorm-swiglu", "groupnorm-resblock", "squeeze-excite", "layernorm-mlp",
                                  "tanh-gelu-mlp"])
def test_each_benchmark_block_becomes_these_steps(name):
    """The scheduler's decisions on `bench --blocks`' blocks (fp32, no timing), step by step: a norm with what makes
    and uses it is one row kernel; a tanh GELU written out (0.5 * x and its tanh branch) is one pass; a bias joins
    its GEMM or convolution; and the values are eager's."""
    module, shape, expected = _blocks()[name]
    torch.manual_seed(0)
    net = network(module, shape)
    plan = planner.make_plan(net, DEVICE, BackendOptions(timing_iterations=0))
    assert [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"] == expected
    if name == "tanh-gelu-mlp" and not torch.cuda.is_available():
        return  # tanh and pow call libdevice, which Triton's CPU interpreter does not run
    x = torch.randn(shape)
    _, out = planned(net, [x])
    assert_matches(out[0], module.eval()(x).detach())
