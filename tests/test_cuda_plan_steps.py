"""The CUDA backend's steps run eagerly on the CPU (generated kernels in Triton's interpreter) against the
reference meanings: the planner's groups and the kernel makers compute what the layers mean. (cuDNN's fused
calls need a GPU: tests/test_cuda_backend.py; fp32 plans without TF32 do not use them.)"""
import logging

import pytest
import torch
import torch.nn.functional as F
from harness import assert_matches_eager, run_plan_eagerly

pytest.importorskip("triton", reason="triton is not installed")

import torchkiln  # noqa: E402
from torchkiln.examples import SmallMobileNet, SmallResNet  # noqa: E402
from torchkiln.errors import NetworkError  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import fusion_report, planner  # noqa: E402
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV  # noqa: E402
from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights  # noqa: E402
from torchkiln.runtime.engine import Engine  # noqa: E402
from torchkiln.runtime.executor import ReferenceExecutor  # noqa: E402
from torchkiln.runtime.plan import Kernel, Plan, Step, slots  # noqa: E402
from torchkiln.runtime.symbols import SymbolBinder  # noqa: E402

CPU = torch.device("cpu")
pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs these plans in test_cuda_backend"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@pytest.fixture(scope="module", autouse=True)
def interpreter(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("torchkiln-cache")))
        yield


def run_plan(network: Network, inputs: list[torch.Tensor]):
    plan = planner.make_plan(network, CPU, BackendOptions(timing_iterations=0))
    return plan, run_plan_eagerly(network, plan, inputs)


@pytest.mark.parametrize("build", [SmallResNet, SmallMobileNet], ids=["resnet", "mobilenet"])
def test_fp32_cnn_plan_matches_the_reference(build):
    data = torchkiln.convert_method_to_engine(build().eval(), "forward", [torchkiln.Input((1, 3, 16, 16))],
                                              backend="reference")
    network = Engine.deserialize(data).network
    x = torch.randn(1, 3, 16, 16)
    plan, out = run_plan(network, [x])
    ops = {plan.kernels[s.kernel].op for s in plan.steps}
    assert "conv_epilogue" in ops  # convolutions with their bias and activation in a generated kernel
    ref = ReferenceExecutor(network, CPU).run([x])
    assert (out[0] - ref[0]).abs().max() <= 1e-4 * ref[0].abs().max()


def test_conv_epilogue_with_relu6_and_residual():
    """conv -> +bias -> clip(0, 6) -> + x: the residual and clip join the convolution's generated epilogue."""
    net = Network("block")
    x = net.add_input("x", torch.float32, (2, 4, 6, 6))
    conv = net.add_convolution_nd(x, torch.randn(4, 4, 3, 3), torch.randn(4), stride=(1, 1), padding=(1, 1),
                                  dilation=(1, 1)).get_output()
    act = net.add_activation(conv, L.ActivationType.CLIP, 0.0, 6.0).get_output()
    net.mark_output(net.add_elementwise(act, x, L.ElementWiseOperation.SUM).get_output())
    xv = torch.randn(2, 4, 6, 6)
    plan, out = run_plan(net, [xv])
    assert [plan.kernels[s.kernel].op for s in plan.steps] == ["conv_epilogue"]
    ref = ReferenceExecutor(net, CPU).run([xv])[0]
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_projections_of_one_input_are_one_gemm():
    """query, key and value projections of one x: one GEMM over the concatenated weights, outputs its columns."""
    net = Network("qkv")
    x = net.add_input("x", torch.float32, (2, 5, 8))
    outs = []
    for n in (8, 8, 4):
        w = net.add_constant(torch.randn(n, 8)).get_output()
        mm = net.add_layer(L.MatrixMultiplyLayer, [x, w], weights={"bias": torch.randn(n)},
                           op1=L.MatrixOperation.TRANSPOSE).get_output()
        outs.append(net.add_activation(mm, L.ActivationType.RELU).get_output())
    for t in outs:
        net.mark_output(t)
    xv = torch.randn(2, 5, 8)
    plan, got = run_plan(net, [xv])
    assert [plan.kernels[s.kernel].op for s in plan.steps].count("linear_group") == 1
    for g, r in zip(got, ReferenceExecutor(net, CPU).run([xv])):
        assert (g - r).abs().max() <= 1e-5 * r.abs().max()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_residual_add_and_layer_norm_step_writes_the_sum_it_returns(dtype):
    """y = ln(x + r) with the precision pass's casts around an fp16 layer norm; the sum is returned too: one
    generated step writing both, as the layers' meanings compute them (the sum rounded before the statistics)."""
    net = Network("add_norm")
    x = net.add_input("x", dtype, (3, 5, 40))
    r = net.add_input("r", dtype, (3, 5, 40))
    s = net.add_elementwise(x, r, L.ElementWiseOperation.SUM).get_output()
    up = net.add_cast(s, torch.float32).get_output() if dtype == torch.float16 else s
    norm = net.add_layer(L.NormalizationLayer, [up], weights={"scale": torch.randn(40), "bias": torch.randn(40)},
                         kind=L.NormalizationKind.LAYER, epsilon=1e-5, normalized_shape=(40,)).get_output()
    net.mark_output(net.add_cast(norm, dtype).get_output() if dtype == torch.float16 else norm)
    net.mark_output(s)
    xs = [torch.randn(3, 5, 40).to(dtype) * 4, torch.randn(3, 5, 40).to(dtype)]
    plan, got = run_plan(net, xs)
    assert [(plan.kernels[st.kernel].kind, plan.kernels[st.kernel].op) for st in plan.steps] == [
        ("generated", "rows")]
    ref = ReferenceExecutor(net, CPU).run(xs)
    assert torch.equal(got[1], ref[1])
    err = (got[0].double() - ref[0].double()).abs()
    if dtype == torch.float16:  # one unit in the last place
        bound = torch.clamp(2.0 ** -10 * ref[0].double().abs(), min=2.0 ** -24)
    else:
        bound = 1e-5 * ref[0].abs().max().item()
    assert bool((err <= bound).all()), err.max()


def test_a_rows_step_without_a_reduction_is_refused_by_name():
    """A plan read from engine bytes may name any layers for a kernel row: its maker checks what it computes."""
    net = Network("not_a_norm")
    x = net.add_input("x", torch.float32, (2, 8))
    net.mark_output(net.add_unary(x, L.UnaryOperation.EXP).get_output())
    plan = Plan(planner.target(CPU), [Kernel("generated", "rows")], [Step(0, (0,))])
    with pytest.raises(NetworkError, match=r"needs a reduction the generator computes"):
        bind_steps(net, plan, place_weights(net, plan, CPU), None, [(2, 8)], CPU, allow_tf32=False)


def test_max_pool_step_keeps_the_convolutions_channels_last():
    """conv -> relu -> max pool 3x3/2/1 with a NaN: the generated pool step gives the reference's values, and
    keeps the channels-last layout the convolution (channels-last kernel) leaves, for a contiguous input."""
    net = Network("stem")
    x = net.add_input("x", torch.float32, (2, 3, 9, 9))
    conv = net.add_convolution_nd(x, torch.randn(6, 3, 3, 3), torch.randn(6), stride=(1, 1), padding=(1, 1),
                                  dilation=(1, 1)).get_output()
    relu = net.add_activation(conv, L.ActivationType.RELU).get_output()
    net.mark_output(net.add_pooling_nd(relu, L.PoolingType.MAX, (3, 3), stride=(2, 2), padding=(1, 1))
                    .get_output())
    xv = torch.randn(2, 3, 9, 9)
    xv[1, :, 4, 4] = float("nan")
    plan, out = run_plan(net, [xv])
    assert [plan.kernels[s.kernel].op for s in plan.steps] == ["conv_epilogue", "max_pool"]
    ref = ReferenceExecutor(net, CPU).run([xv])[0]
    assert torch.equal(out[0].isnan(), ref.isnan()) and out[0][1].isnan().any()
    assert (out[0] - ref).nan_to_num(0.0).abs().max() <= 1e-5 * ref.nan_to_num(0.0).abs().max()
    assert out[0].is_contiguous(memory_format=torch.channels_last) and not out[0].is_contiguous()


def test_a_convolution_read_by_no_pointwise_layer_adds_its_bias_in_a_generated_kernel():
    """conv (with bias) -> average pool: nothing pointwise reads the convolution, yet its bias is a generated
    kernel after the convolution run without it (ATen's bias add over channels-last is not vectorized); the pool,
    a window read, is a generated indexed kernel of its own (the bias is not added once per window position)."""
    net = Network("downsample")
    x = net.add_input("x", torch.float32, (2, 3, 8, 8))
    conv = net.add_convolution_nd(x, torch.randn(5, 3, 1, 1), torch.randn(5), stride=(2, 2), padding=(0, 0),
                                  dilation=(1, 1)).get_output()
    net.mark_output(net.add_pooling_nd(conv, L.PoolingType.AVERAGE, (2, 2), stride=(2, 2), padding=(0, 0))
                    .get_output())
    xv = torch.randn(2, 3, 8, 8)
    plan, out = run_plan(net, [xv])
    assert [(plan.kernels[s.kernel].kind, plan.kernels[s.kernel].op) for s in plan.steps] == [
        ("library", "conv_epilogue"), ("generated", "indexed")]
    ref = ReferenceExecutor(net, CPU).run([xv])[0]
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("norm", ["group", "layer"])
def test_a_convolutions_bias_is_the_first_operation_of_the_norm_after_it(norm):
    """conv (with bias) -> group norm (or a layer norm over C, H, W) -> SiLU: the bias joins the norm's generated
    row kernel (one pass over the convolution's output, not a bias pass and a norm pass); the reference's values."""
    net = Network("conv-norm")
    x = net.add_input("x", torch.float32, (2, 8, 6, 6))
    conv = net.add_convolution_nd(x, torch.randn(8, 8, 3, 3) * 0.2, torch.randn(8) * 3, stride=(1, 1),
                                  padding=(1, 1), dilation=(1, 1)).get_output()
    if norm == "group":
        normed = net.add_normalization(conv, L.NormalizationKind.GROUP, 1e-5, num_groups=4,
                                       scale=torch.rand(8) + 0.5, bias=torch.randn(8)).get_output()
    else:
        normed = net.add_normalization(conv, L.NormalizationKind.LAYER, 1e-5, normalized_shape=(8, 6, 6)).get_output()
    net.mark_output(net.add_activation(normed, L.ActivationType.SILU).get_output())
    xv = torch.randn(2, 8, 6, 6)
    plan, out = run_plan(net, [xv])
    steps = [(plan.kernels[s.kernel].op, [net.layers[j].KIND for j in s.layers]) for s in plan.steps
             if plan.kernels[s.kernel].op != "constant"]
    assert steps == [("conv_epilogue", ["convolution", "normalization", "activation"])], steps
    ref = ReferenceExecutor(net, CPU).run([xv])[0]
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_convolutions_bias_joins_a_layer_norm_over_its_transposed_channels():
    """A depthwise conv (with bias) -> permute to channels-last -> layer norm over the channels -> GELU: the bias
    joins the norm's row kernel, added along the axis the channels moved to, with the transpose a view the kernel
    reads (one pass over the convolution's output); the reference's values."""
    net = Network("conv-permute-norm")
    x = net.add_input("x", torch.float32, (2, 8, 6, 5))
    conv = net.add_convolution_nd(x, torch.randn(8, 1, 3, 3) * 0.3, torch.randn(8) * 3, stride=(1, 1),
                                  padding=(1, 1), dilation=(1, 1), groups=8).get_output()
    shuffled = net.add_shuffle(conv, first_transpose=(0, 2, 3, 1)).get_output()
    normed = net.add_normalization(shuffled, L.NormalizationKind.LAYER, 1e-6, normalized_shape=(8,),
                                   scale=torch.rand(8) + 0.5, bias=torch.randn(8)).get_output()
    net.mark_output(net.add_activation(normed, L.ActivationType.GELU_ERF).get_output())
    xv = torch.randn(2, 8, 6, 5)
    plan, out = run_plan(net, [xv])
    steps = [(plan.kernels[s.kernel].op, [net.layers[j].KIND for j in s.layers]) for s in plan.steps
             if plan.kernels[s.kernel].op != "constant"]
    assert steps == [("conv_epilogue", ["convolution", "shuffle", "normalization", "activation"])], steps
    ref = ReferenceExecutor(net, CPU).run([xv])[0]
    assert ref.std() > 0.3 and (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_one_element_operand_of_an_indexed_kernel_is_read_as_a_block():
    """A concatenation of a one-element tensor and a longer one (block_diag of a 0-d tensor, cartesian_prod of a
    [1] and a [2] tensor): the one-element operand's offset has no index in it, and a masked load needs a block of
    pointers; before, Triton refused the kernel."""
    net = Network("cat-one")
    a, b = net.add_input("a", torch.float32, (1,)), net.add_input("b", torch.float32, (3,))
    doubled = [net.add_elementwise(t, t, L.ElementWiseOperation.SUM).get_output() for t in (a, b)]
    net.mark_output(net.add_concatenation(doubled, 0).get_output())
    av, bv = torch.randn(1), torch.randn(3)
    plan, out = run_plan(net, [av, bv])
    assert "indexed" in [plan.kernels[s.kernel].op for s in plan.steps]
    assert torch.equal(out[0], torch.cat([av * 2, bv * 2]))


@pytest.mark.parametrize("start", [2, 0], ids=["element-2", "element-0"])
def test_an_indexed_kernel_reads_one_element_at_a_constant_index_as_a_block(start):
    """A one-element slice of a longer tensor concatenated with another (x[2:3] then cat): the slice's index is a
    literal, so the operand's offset holds no index variable (`2 * in0_t0`) and must still be a block of pointers
    for its masked load; before, Triton refused the kernel where the element was not the first."""
    net = Network("cat-slice")
    a, b = net.add_input("a", torch.float32, (5,)), net.add_input("b", torch.float32, (3,))
    one = net.add_slice(a, (start,), (1,), (1,)).get_output()
    net.mark_output(net.add_concatenation([one, b], 0).get_output())
    av, bv = torch.randn(5), torch.randn(3)
    plan, out = run_plan(net, [av, bv])
    assert [plan.kernels[s.kernel].op for s in plan.steps] == ["indexed"]
    assert torch.equal(out[0], torch.cat([av[start:start + 1], bv]))


def test_an_indexed_kernel_reads_an_element_of_a_concatenation_at_a_constant_index_as_a_block():
    """cat([cat([a, b])[6:7], c]): the inner concatenation's part is read at `6 - 5`, an index variable of one value
    (no block), so that read too starts from a block of zeros."""
    net = Network("cat-slice-cat")
    a, b, c = (net.add_input(n, torch.float32, (s,)) for n, s in (("a", 5), ("b", 3), ("c", 2)))
    inner = net.add_concatenation([a, b], 0).get_output()
    net.mark_output(net.add_concatenation([net.add_slice(inner, (6,), (1,), (1,)).get_output(), c], 0).get_output())
    av, bv, cv = torch.randn(5), torch.randn(3), torch.randn(2)
    plan, out = run_plan(net, [av, bv, cv])
    assert [plan.kernels[s.kernel].op for s in plan.steps] == ["indexed"]
    assert torch.equal(out[0], torch.cat([bv[1:2], cv]))


@pytest.mark.parametrize("reads", ["x,x,x", "x,x,v", "x,v,x,m"])
def test_an_attention_reading_one_tensor_twice_maps_its_inputs_by_tensor(reads):
    """F.scaled_dot_product_attention(x, x, x) (self-attention without projections), (x, x, v), (x, v, x, mask):
    the step's inputs hold each tensor once, the layer reads one several times; before, the step took its
    operands by position (an IndexError)."""
    net = Network("self-attention")
    given = {"x": net.add_input("x", torch.float32, (1, 2, 4, 8)), "v": net.add_input("v", torch.float32, (1, 2, 4, 8)),
             "m": net.add_input("m", torch.float32, (4, 4))}
    names = reads.split(",")
    net.mark_output(net.add_attention(*(given[n] for n in names[:3]),
                                      mask=given[names[3]] if len(names) > 3 else None).get_output())
    xs = [torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(4, 4)]
    _, out = run_plan(net, xs)
    by_name = dict(zip("xvm", xs))
    q, k, v = (by_name[n] for n in names[:3])
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=by_name[names[3]] if len(names) > 3 else None)
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_an_attention_with_a_constant_unaligned_mask_matches_eager_on_every_call():
    """A window attention's constant position bias over 49 keys: the step aligns it at its first call and passes the
    aligned copy from then on; every call (new query values) matches eager SDPA with the mask as given."""
    torch.manual_seed(0)
    net = Network("window attention")
    q = net.add_input("q", torch.float32, (2, 3, 49, 8))
    bias = torch.randn(1, 3, 49, 49)
    net.mark_output(net.add_attention(q, q, q, net.add_constant(bias).get_output()).get_output())
    plan = planner.make_plan(net, CPU, BackendOptions(timing_iterations=0))
    bound = bind_steps(net, plan, place_weights(net, plan, CPU), SymbolBinder.for_network(net), [(2, 3, 49, 8)], CPU,
                       allow_tf32=False)
    for _ in range(2):
        x = torch.randn(2, 3, 49, 8)
        ref = F.scaled_dot_product_attention(x, x, x, attn_mask=bias)
        out = bound.run_eagerly([x])[0]
        assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_layer_reading_one_tensor_twice_runs_alone_in_its_step():
    """x @ x.T (a covariance's product): the step's inputs hold x once, the layer reads it twice."""
    net = Network("gram")
    x = net.add_input("x", torch.float32, (3, 5))
    net.mark_output(net.add_matrix_multiply(x, L.MatrixOperation.NONE, x, L.MatrixOperation.TRANSPOSE).get_output())
    xv = torch.randn(3, 5)
    _, out = run_plan(net, [xv])
    assert (out[0] - xv @ xv.T).abs().max() <= 1e-5 * (xv @ xv.T).abs().max()


def test_sibling_pointwise_groups_over_one_input_become_one_pass():
    """GELU's shape as GPT-2 writes it, 0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3))), with a sigmoid for the
    tanh: 0.5 * x starts one group and the branch another (both read x first); their product joins the branch's
    group, and the 0.5 * x group, which nothing between the two reads, runs inside it: one generated step, the
    reference's values."""
    net = Network("gelu")
    x = net.add_input("x", torch.float32, (4, 8, 32))

    def const(v):
        return net.add_constant(torch.tensor(v)).get_output()

    def ew(a, b, op):
        return net.add_elementwise(a, b, op).get_output()

    E = L.ElementWiseOperation
    half = ew(x, const(0.5), E.PROD)
    cube = ew(ew(x, x, E.PROD), x, E.PROD)  # (pow calls libdevice, which the interpreter does not run)
    inner = ew(ew(x, ew(cube, const(0.044715), E.PROD), E.SUM), const(0.7978845608), E.PROD)
    t = net.add_activation(inner, L.ActivationType.SIGMOID).get_output()  # (tanh calls libdevice: see above)
    net.mark_output(ew(half, ew(t, const(1.0), E.SUM), E.PROD))
    value = torch.randn(4, 8, 32) * 3
    plan, out = run_plan(net, [value])
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ops == ["pointwise"]
    ref = ReferenceExecutor(net, CPU).run([value])
    assert (out[0] - ref[0]).abs().max() <= 1e-5 * ref[0].abs().max()


def _read_between() -> Network:
    """exp(x) is read by a reduction placed before the group that reads it again."""
    net = Network("apart")
    x = net.add_input("x", torch.float32, (4, 12))
    e = net.add_unary(x, L.UnaryOperation.EXP).get_output()
    s = net.add_reduce(e, L.ReduceOperation.PROD, (0,), keep_dims=True).get_output()  # a product: ATen
    y = net.add_elementwise(net.add_unary(x, L.UnaryOperation.ABS).get_output(), s, L.ElementWiseOperation.SUM)
    net.mark_output(net.add_elementwise(y.get_output(), e, L.ElementWiseOperation.PROD).get_output())
    return net


def _kept_alive() -> Network:
    """abs(a) is read only by its own group; the later group reads b, not a: merging would keep a alive until then."""
    net = Network("alive")
    x = net.add_input("x", torch.float32, (4, 12))

    def product():  # (12 products an output: a library call)
        return net.add_matrix_multiply(x, L.MatrixOperation.NONE, net.add_constant(torch.randn(12, 12)).get_output(),
                                       L.MatrixOperation.NONE).get_output()

    early = net.add_unary(product(), L.UnaryOperation.ABS).get_output()
    late = net.add_unary(product(), L.UnaryOperation.NEG).get_output()
    net.mark_output(net.add_elementwise(late, early, L.ElementWiseOperation.SUM).get_output())
    return net


@pytest.mark.parametrize("build, reason", [(_read_between, "which runs between them, reads it"),
                                           (_kept_alive, "alive until the later group runs")],
                         ids=["read-between", "kept-alive"])
def test_groups_that_cannot_merge_stay_apart_with_the_reason_logged(caplog, build, reason):
    net = build()
    value = torch.randn(4, 12)
    with caplog.at_level(logging.DEBUG, logger=planner.__name__):
        plan, out = run_plan(net, [value])
    assert [plan.kernels[s.kernel].op for s in plan.steps].count("pointwise") == 2
    assert reason in caplog.text
    ref = ReferenceExecutor(net, CPU).run([value])
    assert (out[0] - ref[0]).abs().max() <= 1e-5 * ref[0].abs().max()


class ShiftedWindows(torch.nn.Module):
    """A shifted-window attention's data movement: roll, window partition, a linear, window reverse, roll back,
    plus the input."""

    def __init__(self, c: int = 8, window: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.window, self.shift = window, shift
        self.proj = torch.nn.Linear(c, c)

    def forward(self, x):
        b, h, w, c = x.shape
        s, k = self.shift, self.window
        y = torch.roll(x, (-s, -s), (1, 2))
        y = y.view(b, h // k, k, w // k, k, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, k * k, c)
        y = self.proj(y)
        y = y.view(b, h // k, w // k, k, k, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return x + torch.roll(y, (s, s), (1, 2))


class Rotary(torch.nn.Module):
    """q * cos + rotate_half(q) * sin, as decoder LLMs apply rotary position embeddings."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.q, self.heads = torch.nn.Linear(d * heads, d * heads), heads
        angles = torch.arange(6)[:, None] * torch.arange(d)[None, :] * 0.1
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * self.cos + rotated * self.sin


@pytest.mark.parametrize("build,shape", [(ShiftedWindows, (2, 8, 8, 8)), (Rotary, (2, 6, 32))],
                         ids=["shifted-windows", "rotary"])
def test_movement_runs_as_index_arithmetic_in_generated_kernels(build, shape):
    torch.manual_seed(0)
    module = build().eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(shape)], backend="reference")
    network = Engine.deserialize(data).network
    x = torch.randn(shape)
    plan, out = run_plan(network, [x])
    ops = [plan.kernels[s.kernel].op for s in plan.steps]
    assert "indexed" in ops and "concatenation" not in ops
    ref = module(x)
    assert (out[0] - ref).abs().max() <= 1e-4 * ref.abs().max()


class TopDown(torch.nn.Module):
    """A feature pyramid's top-down step: the coarser map upsampled (nearest) to the lateral's size and added."""

    def __init__(self, mode: str = "nearest", size=None, scale=None) -> None:
        super().__init__()
        self.mode, self.size, self.scale = mode, size, scale

    def forward(self, coarse, lateral):
        size = self.size or (None if self.scale else lateral.shape[-2:])
        return torch.relu(lateral + F.interpolate(coarse * 2.0, size=size, scale_factor=self.scale, mode=self.mode))


@pytest.mark.parametrize("mode, size, scale, shapes, fused", [
    ("nearest", None, None, [(2, 8, 5, 6), (2, 8, 10, 12)], True),  # grown by 2 to the lateral's size
    ("nearest-exact", None, 4.0, [(2, 8, 3, 5), (2, 8, 12, 20)], True),
    ("nearest", None, None, [(2, 8, 8, 6), (2, 8, 4, 3)], True),  # shrunk by 2
    ("nearest-exact", None, None, [(2, 8, 12, 6), (2, 8, 4, 3)], True),  # shrunk by 3, 2: the middle of each run
    ("nearest", None, None, [(2, 8, 5, 6), (2, 8, 15, 18)], False),  # by 3: ATen's float index decides
    ("nearest", None, 2.1, [(2, 8, 5, 6), (2, 8, 10, 12)], False),  # a factor that is not the sizes' ratio
    ("bicubic", None, None, [(2, 8, 5, 6), (2, 8, 10, 12)], False)], ids=[
    "grown", "nearest-exact-by-4", "shrunk", "nearest-exact-shrunk", "by-3-stays-aten", "other-factor-stays-aten",
    "bicubic-stays-aten"])
def test_a_nearest_resize_by_a_whole_ratio_is_index_arithmetic(mode, size, scale, shapes, fused):
    torch.manual_seed(0)
    module = TopDown(mode, size, scale).eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(s) for s in shapes],
                                              backend="reference")
    network = Engine.deserialize(data).network
    xs = [torch.randn(s) for s in shapes]
    plan, out = run_plan(network, xs)
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert (ops == ["indexed"]) == fused, ops
    ref = module(*xs)
    assert torch.equal(out[0], ref) if fused else (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


class Upsampled(torch.nn.Module):
    """A segmentation head's tail: logits scaled and interpolated (bilinear or linear) to a size or by a factor."""

    def __init__(self, mode: str, size=None, scale=None, align_corners=None) -> None:
        super().__init__()
        self.mode, self.size, self.scale, self.align_corners = mode, size, scale, align_corners

    def forward(self, x):
        return F.interpolate(x * 0.5, size=self.size, scale_factor=self.scale, mode=self.mode,
                             align_corners=self.align_corners)


@pytest.mark.parametrize("mode, size, scale, align, shape, channels_last, dtype", [
    ("bilinear", (40, 48), None, False, (2, 5, 5, 6), False, torch.float32),  # grown 8x, to a size
    ("bilinear", (7, 9), None, False, (2, 5, 12, 20), True, torch.float32),  # shrunk, channels-last
    ("bilinear", (28, 28), None, False, (2, 6, 1, 1), True, torch.float32),  # a pooled map spread out
    ("bilinear", None, 2.5, False, (1, 3, 6, 7), False, torch.float32),  # a factor that is not the sizes' ratio
    ("bilinear", (11, 13), None, True, (2, 4, 5, 6), False, torch.float32),  # aligned corners
    ("linear", (17,), None, False, (2, 4, 6), False, torch.float32),
    ("bilinear", (40, 48), None, False, (2, 5, 5, 6), True, torch.float16)], ids=[
    "grown", "shrunk-channels-last", "from-one-pixel", "factor", "align-corners", "linear", "half"])
def test_a_linear_resize_is_one_generated_indexed_kernel(mode, size, scale, align, shape, channels_last, dtype):
    module = Upsampled(mode, size, scale, align).eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(shape, dtype=dtype)],
                                              backend="reference")
    network = Engine.deserialize(data).network
    x = torch.randn(shape).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    plan, out = run_plan(network, [x])
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ops == ["indexed"], ops
    ref = module(x.float()).to(dtype) if dtype == torch.float16 else module(x)
    assert out[0].shape == ref.shape
    bound = 2e-3 if dtype == torch.float16 else 1e-5  # float32 arithmetic; fp16: one rounding of the result
    assert (out[0].float() - ref.float()).abs().max() <= bound * ref.float().abs().max()


class Broadcast(torch.nn.Module):
    """A map interpolated (linear or bilinear) to a size with a dim of 1, then added to a larger map (a broadcast)."""

    def __init__(self, mode: str, size) -> None:
        super().__init__()
        self.mode, self.size = mode, size

    def forward(self, x, y):
        return y + F.interpolate(x * 0.5, size=self.size, mode=self.mode)


@pytest.mark.parametrize("mode, size, shapes", [
    ("bilinear", (1, 5), [(2, 3, 4, 6), (2, 3, 7, 5)]), ("linear", (1,), [(2, 3, 4), (2, 3, 6)])],
    ids=["bilinear", "linear"])
def test_a_linear_resize_to_one_pixel_read_at_a_broadcast_index(mode, size, shapes):
    """The resize's output read at a literal index (0 along its broadcast dim) computes its source coordinate."""
    module = Broadcast(mode, size).eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(s) for s in shapes],
                                              backend="reference")
    network = Engine.deserialize(data).network
    xs = [torch.randn(s) for s in shapes]
    plan, out = run_plan(network, xs)
    assert [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"] == ["indexed"]
    ref = module(*xs)
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


class Resized(torch.nn.Module):
    """An image resized (bilinear) as it is, of any dtype."""

    def forward(self, x):
        return F.interpolate(x, size=(7, 9), mode="bilinear")


def test_an_integer_linear_resize_stays_on_aten():
    """ATen's uint8 bilinear resize rounds its fixed-point sum; weighed in float32 and truncated on store, a
    generated kernel gave 1 less at some pixels."""
    shape = (1, 3, 4, 5)
    data = torchkiln.convert_method_to_engine(Resized().eval(), "forward", [torchkiln.Input(shape, dtype=torch.uint8)],
                                              backend="reference")
    network = Engine.deserialize(data).network
    torch.manual_seed(0)
    x = torch.randint(0, 256, shape, dtype=torch.uint8)
    plan, out = run_plan(network, [x])
    assert torch.equal(out[0], Resized()(x))


class Pooled(torch.nn.Module):
    """A pool, then the pointwise work that reads it: the pool minus its input, a per-channel scale and a residual
    add (a pooling token mixer) where the pool keeps the shape, else a scale and a shift; `before` puts a pointwise
    producer in front of the pool."""

    def __init__(self, pool, channels: int, before: bool = False) -> None:
        super().__init__()
        self.pool, self.before = pool, before
        self.scale = torch.nn.Parameter(torch.rand(channels) + 0.5)

    def forward(self, x):
        y = torch.relu(x) * 2.0 if self.before else x
        pooled = self.pool(y)
        scale = self.scale.view([-1] + [1] * (pooled.dim() - 2))
        return x + (pooled - y) * scale if pooled.shape == y.shape else pooled * scale + 1.0


def _pooled_plan(module, shape, dtype=torch.float32, x=None):
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(shape, dtype=dtype)],
                                              backend="reference")
    network = Engine.deserialize(data).network
    plan, out = run_plan(network, [x if x is not None else torch.randn(shape)])
    return network, plan, out


@pytest.mark.parametrize("pool, shape", [
    (torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False), (2, 4, 9, 7)),
    (torch.nn.AvgPool2d(2, 2), (2, 4, 8, 6)),
    (torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True), (2, 4, 8, 7)),  # the last window clipped at the padding's end
    (torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 4, 8, 7)),
    (torch.nn.AvgPool2d(3, 1, 1, divisor_override=5), (2, 4, 6, 6)),
    (torch.nn.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 4, 11)),
    (torch.nn.MaxPool1d(3, 2, 1, dilation=2), (2, 4, 11)),
    (torch.nn.MaxPool3d(2, 2, ceil_mode=True), (2, 3, 5, 4, 6))], ids=[
    "avg-3x3-s1-exclude-pad", "avg-2x2-s2", "avg-ceil-include-pad", "avg-ceil-exclude-pad", "avg-divisor",
    "avg-1d", "max-1d-dilated", "max-3d-ceil"])
def test_a_pool_is_index_arithmetic_in_the_kernel_of_its_readers(pool, shape):
    """A pool on ATen becomes a generated indexed kernel with the pointwise layers reading it, and matches eager:
    every window position read where it falls inside the input, the divisor as ATen counts it."""
    torch.manual_seed(0)
    module = Pooled(pool, shape[1]).eval()
    x = torch.randn(shape)
    _, plan, out = _pooled_plan(module, shape, x=x)
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ops == ["indexed"], ops
    ref = module(x)
    assert out[0].shape == ref.shape
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_half_precision_pool_sums_in_float32_and_rounds_once():
    """As ATen's CUDA kernel: fp16 values summed in float32 over each window, divided, rounded once on store."""
    torch.manual_seed(1)
    shape = (2, 8, 9, 9)
    pool = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)
    x = torch.randn(shape).half().contiguous(memory_format=torch.channels_last)
    _, plan, out = _pooled_plan(pool, shape, torch.float16, x)
    assert [plan.kernels[s.kernel].op for s in plan.steps] == ["indexed"]
    ref = pool(x.float())
    assert F.cosine_similarity(out[0].float().flatten(), ref.flatten(), dim=0) >= 0.999
    assert (out[0].float() - ref).abs().max() <= 1e-3 * ref.abs().max()  # one fp16 rounding of the result


def test_what_makes_a_pools_input_runs_before_its_kernel():
    """The pointwise producer of a pool's input stays a step of its own: inside the pool's kernel it would be
    computed once per window position."""
    torch.manual_seed(2)
    module = Pooled(torch.nn.AvgPool2d(3, 1, 1), 4, before=True).eval()
    x = torch.randn(2, 4, 6, 5)
    network, plan, out = _pooled_plan(module, tuple(x.shape), x=x)
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ops == ["pointwise", "indexed"], ops
    ref = module(x)
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_a_pool_of_a_wide_window_stays_on_aten():
    """More window positions than a kernel unrolls: the pool runs on ATen, and the fusion report says why."""
    module = Pooled(torch.nn.AvgPool2d(8, 1), 3).eval()
    x = torch.randn(1, 3, 9, 9)
    network, plan, out = _pooled_plan(module, tuple(x.shape), x=x)
    assert "pooling" in [plan.kernels[s.kernel].op for s in plan.steps]
    assert "its window has 64 positions (a kernel unrolls at most 49)" in "\n".join(
        fusion_report.format_edges(network, plan))
    ref = module(x)
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


class FeedForward(torch.nn.Module):
    """Up-projection, activation, down-projection; `flat` runs the up-projection on the rows as a matrix and
    reshapes back before the activation (a transformer's Conv1D feed-forward)."""

    def __init__(self, activation, bias: bool = True, flat: bool = False) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 64, bias=bias), torch.nn.Linear(64, 16)
        self.activation, self.flat = activation, flat

    def forward(self, x):
        h = self.up(x.reshape(-1, 16)).reshape(x.shape[0], x.shape[1], 64) if self.flat else self.up(x)
        return self.down(self.activation(h))


@pytest.mark.parametrize("activation, bias, flat, fused", [
    (torch.nn.ReLU(), False, False, True), (torch.nn.GELU(approximate="tanh"), True, True, True),
    (torch.nn.GELU(), True, False, False)], ids=["relu-no-bias", "tanh-gelu-reshaped", "erf-gelu-stays-apart"])
def test_a_products_relu_or_tanh_gelu_is_its_library_epilogue(activation, bias, flat, fused):
    """A half-precision linear layer whose only reader is a ReLU or a tanh GELU is one cuBLASLt call with the
    activation in its epilogue; GELU's erf form has no such epilogue and stays a pass of its own."""
    torch.manual_seed(3)
    module = FeedForward(activation, bias, flat).eval()
    x = torch.randn(2, 5, 16)
    data = torchkiln.convert_method_to_engine(module.half(), "forward",
                                              [torchkiln.Input((2, 5, 16), dtype=torch.float16)], backend="reference")
    network = Engine.deserialize(data).network
    plan, out = run_plan(network, [x.half()])
    ops = [plan.kernels[s.kernel].op for s in plan.steps]
    assert ("linear_activation" in ops) == fused, ops
    ref = module.float()(x)
    got = out[0].float()
    assert F.cosine_similarity(got.flatten(), ref.flatten(), dim=0) >= 0.999
    assert (got - ref).abs().max() <= 1e-2 * ref.abs().max()  # fp16 products and activations, rounded as stored


def _squeeze_excite(returned: bool = False) -> Network:
    """conv -> SiLU -> mean over H, W -> 1x1 reduce -> ReLU -> 1x1 expand -> sigmoid -> SiLU output * gate; the
    SiLU's output also returned where `returned`."""
    net = Network("se")
    x = net.add_input("x", torch.float32, (2, 8, 6, 6))
    conv = net.add_convolution_nd(x, torch.randn(8, 8, 3, 3) * 0.3, torch.randn(8), stride=(1, 1), padding=(1, 1),
                                  dilation=(1, 1)).get_output()
    act = net.add_activation(conv, L.ActivationType.SILU).get_output()
    mean = net.add_reduce(act, L.ReduceOperation.AVG, (2, 3), True).get_output()

    def pointwise_conv(t, cin, cout):
        return net.add_convolution_nd(t, torch.randn(cout, cin, 1, 1), torch.randn(cout), stride=(1, 1),
                                      padding=(0, 0), dilation=(1, 1)).get_output()

    hidden = net.add_activation(pointwise_conv(mean, 8, 2), L.ActivationType.RELU).get_output()
    gate = net.add_activation(pointwise_conv(hidden, 2, 8), L.ActivationType.SIGMOID).get_output()
    net.mark_output(net.add_elementwise(act, gate, L.ElementWiseOperation.PROD).get_output())
    if returned:
        net.mark_output(act)
    return net


@pytest.mark.parametrize("returned", [False, True], ids=["recomputed", "returned"])
def test_a_row_steps_pointwise_prologue_is_recomputed_by_its_other_readers(returned):
    """Squeeze-excitation: the SiLU feeding the mean is read again by the gate's multiply. The multiply's step
    computes the SiLU again from the convolution's output, so the row step writes only its means (one pass over
    the activations saved, and one write). Not where the SiLU's output is returned: it is written then."""
    net = _squeeze_excite(returned)
    xv = torch.randn(2, 8, 6, 6)
    plan, out = run_plan(net, [xv])
    silu = next(j for j, layer in enumerate(net.layers) if isinstance(layer, L.ActivationLayer)
                and layer.type == L.ActivationType.SILU)
    mean = next(j for j, layer in enumerate(net.layers) if isinstance(layer, L.ReduceLayer))
    rows = next(k for k, s in enumerate(plan.steps) if mean in s.layers)  # (the convolution's bias joins it)
    holding = [plan.kernels[s.kernel].op for s in plan.steps if silu in s.layers]
    io = plan.io(net)
    if returned:
        assert holding == ["conv_epilogue"] and len(io[rows].outputs) == 2
    else:  # it writes the convolution's output (with its bias), read by the multiply, and the means
        assert holding == ["conv_epilogue", "pointwise"] and len(io[rows].outputs) == 2
        assert slots(net)[id(net.layers[silu].outputs[0])] not in io[rows].outputs
    for got, ref in zip(out, ReferenceExecutor(net, CPU).run([xv])):
        assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


class LayerScaleResidual(torch.nn.Module):
    """ConvNeXt's tail: a channels-last MLP output scaled per channel, permuted back to NCHW, added to the input."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(c, c)
        self.gamma = torch.nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        return x + (self.fc(x.permute(0, 2, 3, 1)) * self.gamma).permute(0, 3, 1, 2)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_a_permute_between_pointwise_steps_is_index_arithmetic_in_one_kernel(channels_last):
    """The layer-scale multiply, the permute back and the residual add are one indexed kernel (the permute is a view,
    but the multiply's output was a pass of its own); it walks the residual's layout; the reference's values."""
    torch.manual_seed(0)
    data = torchkiln.convert_method_to_engine(LayerScaleResidual().eval(), "forward", [torchkiln.Input((2, 8, 5, 6))],
                                              backend="reference")
    network = Engine.deserialize(data).network
    x = torch.randn(2, 8, 5, 6)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    plan, out = run_plan(network, [x])
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ops[-1] == "indexed" and "pointwise" not in ops, ops
    assert out[0].is_contiguous(memory_format=torch.channels_last) == channels_last
    ref = ReferenceExecutor(network, CPU).run([x])[0]
    assert (out[0] - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_control_flow_layers_run_their_sub_networks_by_their_own_plans():
    """A loop's body and a conditional's branches run as CUDA plans (a generated pointwise step in the body) and
    give the reference meanings; such an engine is never captured as a CUDA graph (its condition is read on the
    host)."""
    from test_onnx_export import carried_body, scalar, subnetwork
    from torchkiln.runtime.backends.cuda import control_flow
    from torchkiln.runtime.backends.cuda.runner import captures_graphs

    net = Network("control_flow")
    x, r, p = net.add_input("x", torch.float32, (4,)), net.add_input("r", torch.float32, (4,)), \
        net.add_input("p", torch.bool, ())
    looped = net.add_loop(scalar(net, 50), scalar(net, True), [x], [r], carried_body(0.5, 30.0), 50).get_output()
    branch = net.add_conditional(p, [looped], subnetwork("then", [((4,), torch.float32)], lambda n, a: n.add_activation(
        n.add_unary(a, L.UnaryOperation.EXP).get_output(), L.ActivationType.SIGMOID).get_output()),
        subnetwork("else", [((4,), torch.float32)], lambda n, a: a)).get_output()
    net.mark_output(branch)
    seen = []
    original = control_flow.SubnetworkPlans.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(control_flow.SubnetworkPlans, "run", lambda self, network, *args: seen.append(
            network.name) or original(self, network, *args))
        for taken in (True, False):
            xs = [torch.rand(4), torch.rand(4), torch.tensor(taken)]
            plan, out = run_plan(net, xs)
            assert_matches_eager(out, ReferenceExecutor(net, CPU).run(xs))
    assert {"then", "else", "body"} <= set(seen), seen
    assert not captures_graphs(net, plan)
    body_plan = planner.make_plan(net.layers[-2].body, CPU, BackendOptions(timing_iterations=0))
    assert "pointwise" in [body_plan.kernels[s.kernel].op for s in body_plan.steps]


def _decided_plan(model, spec):
    """The reference engine's network of `model` for `spec`, its CUDA plan, and the plan's one decided step."""
    from torchkiln.runtime.backends.cuda import control_flow

    network = Engine.deserialize(torchkiln.convert_method_to_engine(model, "forward", [spec],
                                                                    backend="reference")).network
    plan = planner.make_plan(network, CPU, BackendOptions(timing_iterations=0))
    [k] = control_flow.decided_layers(network, plan.steps)
    return network, plan, k


def _bind_shape(network, plan, shape):
    return bind_steps(network, plan, place_weights(network, plan, CPU), SymbolBinder.for_network(network), [shape],
                      CPU, allow_tf32=False)


@pytest.mark.parametrize("name, shapes", [("if", ((2, 100, 8), (3, 40, 8))), ("bool-of-sizes", ((2, 40), (2, 41))),
                                         ("for", ((1, 8), (5, 8)))])
def test_control_flow_the_input_shapes_decide_is_decided_when_the_shapes_are_bound(name, shapes):
    """`if x.size(1) > 64`, `if bool((arange(x.size(1)) < 40).all())` and `for i in range(x.size(0))` on dynamic
    dims: the runner decides the branch or the trip count from the bound shapes, so the layer's step reads neither
    its predicate nor its trip count and condition (meta tensors in their place, which cannot be read, change
    nothing) and the engine may be captured as one CUDA graph per shape; shapes taking either branch, and other
    trip counts, give eager's answers."""
    from test_control_flow import ROWS, SEQUENCES, WINDOWS, LongSequences, RowSteps, WithinWindow
    from torchkiln.runtime.backends.cuda.runner import captures_graphs

    model, spec = {"if": (LongSequences, SEQUENCES), "bool-of-sizes": (WithinWindow, WINDOWS),
                   "for": (RowSteps, ROWS)}[name]
    model = model().eval()
    network, plan, k = _decided_plan(model, spec)
    assert captures_graphs(network, plan)
    layer = network.layers[plan.steps[k].layers[0]]
    unread = [slots(network)[id(t)] for t in layer.inputs[:2 if name == "for" else 1]]
    for shape in shapes:
        x = torch.randn(shape)
        bound = _bind_shape(network, plan, shape)
        assert bound.capturable
        values = [x] + [None] * (bound.num_slots - 1)
        for j, (fn, ins, outs, _) in enumerate(bound.fns):
            if j == k:
                for slot in unread:
                    values[slot] = torch.empty((), dtype=values[slot].dtype, device="meta")
            for slot, value in zip(outs, fn([values[i] for i in ins])):
                values[slot] = value
        with torch.no_grad():
            assert_matches_eager(values[bound.output_slots[0]], model(x))


@pytest.mark.parametrize("on_data", [True, False], ids=["data", "shape"])
def test_a_branch_reading_a_tensor_sized_by_an_expression_of_dynamic_dims_runs_by_its_plan(on_data):
    """x.flatten() (s0 * s1 elements) read by the branches: their plans are bound with the outer network's bindings
    (binding the sub-network's own input dims refused them: EngineFormatError)."""
    from test_control_flow import WINDOWS, Flattened

    model = Flattened(on_data).eval()
    network = Engine.deserialize(torchkiln.convert_method_to_engine(model, "forward", [WINDOWS],
                                                                    backend="reference")).network
    plan = planner.make_plan(network, CPU, BackendOptions(timing_iterations=0))
    for shape, shift in (((2, 100), 1.0), ((2, 40), -1.0), ((4, 50), 1.0)):
        x = torch.randn(shape) + shift
        assert_matches_eager(run_plan_eagerly(network, plan, [x])[0], model(x))


def test_a_decided_loop_of_more_iterations_than_a_graph_holds_runs_uncaptured_at_that_shape(monkeypatch):
    from test_control_flow import ROWS, RowSteps
    from torchkiln.runtime.backends.cuda import control_flow

    monkeypatch.setattr(control_flow, "MAX_CAPTURED_TRIPS", 4)
    model = RowSteps().eval()
    network, plan, _ = _decided_plan(model, ROWS)
    for rows, capturable in ((4, True), (5, False)):
        x = torch.randn(rows, 8)
        bound = _bind_shape(network, plan, (rows, 8))
        assert bound.capturable is capturable
        assert_matches_eager(bound.run_eagerly([x])[0], model(x))


def test_int8_linear_plan_matches_the_reference_engine(monkeypatch):
    """The int8 two-linear model of tests/test_cuda_quant_kernels.py's GPU engine test, its CUDA plan (quantize
    steps, torch._int_mm with the dequantize epilogue, the ReLU's generated kernel) on the CPU: the reference
    engine's values within fp32 rounding, and no value a quantization step away. (On an H100 the engine test saw
    46% of outputs beyond 1e-5 of max|ref|: not the steps' arithmetic, which this pins; docs/quantization.md.) The
    weights are 8-bit, as a GPU build's, whatever this CPU's integer kernels (runtime/integer_kernels.py)."""
    from torchkiln.runtime import integer_kernels

    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
    x = torch.randn(64, 64)
    network = Engine.deserialize(torchkiln.convert_method_to_engine(
        model, "forward", [x], backend="reference", enabled_precisions={torch.int8}, calibration_inputs=[x])).network
    plan, out = run_plan(network, [x])
    assert sum(plan.kernels[s.kernel].op == "quantized_matmul" for s in plan.steps) == 2
    ref = ReferenceExecutor(network, CPU).run([x])[0]
    assert float((out[0] - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


class PositionIds(torch.nn.Module):
    """RoBERTa's position ids (transformers' create_position_ids_from_input_ids, padding index 1) and their
    embedding: ne, int cast, cumsum, type_as, add, mul, long, add, then the gather."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = torch.nn.Embedding(40, 8, padding_idx=1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = input_ids.ne(1).int()
        incremental = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        return self.positions(incremental.long() + 1)


def test_integer_position_ids_are_one_generated_scan_kernel():
    """The integer pointwise layers around the cumsum join it in one generated row step (the scan its reduction);
    the embedding's gather reads ids proved to lie in [1, 13] (ir/value_ranges.py) of its 40 rows, so it is a
    generated indexed kernel. Exact against eager, padding included."""
    torch.manual_seed(0)
    module = PositionIds().eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input((4, 12), dtype=torch.int64)],
                                              backend="reference")
    network = Engine.deserialize(data).network
    ids = torch.randint(0, 40, (4, 12))
    ids[:, 9:] = 1
    ids[0, 3] = 1
    plan, out = run_plan(network, [ids])
    steps = [(plan.kernels[s.kernel].kind, plan.kernels[s.kernel].op) for s in plan.steps
             if plan.kernels[s.kernel].op != "constant"]
    assert steps == [("generated", "rows"), ("generated", "indexed")]
    assert len(plan.steps[-2].layers) == 7  # ne, cast, cumsum, cast, mul, cast, add (the + 0 is folded)
    assert torch.equal(out[0], module(ids))


def test_integer_division_by_a_run_time_divisor_stays_on_aten(caplog):
    """x // y of int tensors: a zero divisor raises in ATen, so the layer stays there, the reason logged; the integer
    add after it is a generated kernel."""
    from torchkiln.runtime.backends.cuda.codegen.pointwise import fusable

    net = Network("div")
    x, y = net.add_input("x", torch.int32, (3, 5)), net.add_input("y", torch.int32, (3, 5))
    quotient = net.add_elementwise(x, y, L.ElementWiseOperation.FLOOR_DIV)
    net.mark_output(net.add_elementwise(quotient.get_output(), x, L.ElementWiseOperation.SUM).get_output())
    assert "run-time divisor" in fusable(quotient)
    xv = torch.randint(-50, 50, (3, 5), dtype=torch.int32)
    yv = (torch.randint(1, 7, (3, 5)) * (1 - 2 * (torch.arange(15).reshape(3, 5) % 2))).int()
    with caplog.at_level(logging.DEBUG, logger=planner.__name__):
        plan, out = run_plan(net, [xv, yv])
    assert f"elementwise {quotient.name!r} runs on ATen: an integer division by a run-time divisor" in caplog.text
    assert [(plan.kernels[s.kernel].kind, plan.kernels[s.kernel].op) for s in plan.steps] == \
        [("aten", "elementwise"), ("generated", "pointwise")]
    assert torch.equal(out[0], torch.div(xv, yv, rounding_mode="floor") + xv)


class MaskedScale(torch.nn.Module):
    """A select between pointwise work: where(x > 0, x * y, -y) + 1, as masking code writes it."""

    def forward(self, x, y):
        return torch.where(x > 0, x * y, -y) + 1.0


def test_a_select_joins_the_pointwise_group_around_it():
    torch.manual_seed(0)
    data = torchkiln.convert_method_to_engine(MaskedScale(), "forward", [torchkiln.Input((4, 33))] * 2,
                                              backend="reference")
    network = Engine.deserialize(data).network
    xs = [torch.randn(4, 33), torch.randn(4, 33)]
    plan, out = run_plan(network, xs)
    assert [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"] == ["pointwise"]
    assert torch.equal(out[0], MaskedScale()(*xs))


def _positions(net: Network, ids, pad: int = 1):
    """RoBERTa's position ids of `ids` (int64): cumsum of the non-padding mask, times the mask, plus the padding
    index; proved to lie in [pad, pad + ids' length]."""
    one = net.add_constant(torch.tensor(pad)).get_output()
    mask = net.add_cast(net.add_elementwise(ids, one, L.ElementWiseOperation.NOT_EQUAL).get_output(),
                        torch.int64).get_output()
    running = net.add_cumulative(mask, L.CumulativeOperation.SUM, 1).get_output()
    kept = net.add_elementwise(running, mask, L.ElementWiseOperation.PROD).get_output()
    return net.add_elementwise(kept, one, L.ElementWiseOperation.SUM).get_output()


def _padded_ids(seed: int = 0) -> torch.Tensor:
    ids = torch.randint(2, 50, (3, 12), generator=torch.Generator().manual_seed(seed))
    ids[0, 8:] = 1
    ids[2, :] = 1
    return ids


def test_gathers_at_indices_proved_in_range_are_one_generated_indexed_kernel():
    """Embeddings at computed position ids: a table row gathered by the positions (proved in [1, 13] of 40 rows),
    an element gather from a constant [3, 40] buffer by them (token types, proved [0, 0]), the token-type row by
    that, and their sum: one generated indexed kernel after the position ids' row step. Exact against the
    reference, padding rows included."""
    g = torch.Generator().manual_seed(1)
    net = Network("embeddings")
    ids = net.add_input("ids", torch.int64, (3, 12))
    positions = _positions(net, ids)
    table = net.add_constant(torch.randn(40, 8, generator=g)).get_output()
    buffered = net.add_constant(torch.zeros(3, 40, dtype=torch.int64)).get_output()
    types = net.add_gather(buffered, positions, 1, L.GatherMode.ELEMENT).get_output()
    type_table = net.add_constant(torch.randn(2, 8, generator=g)).get_output()
    rows = net.add_gather(table, positions, 0).get_output()
    typed = net.add_gather(type_table, types, 0).get_output()
    net.mark_output(net.add_elementwise(rows, typed, L.ElementWiseOperation.SUM).get_output())
    x = _padded_ids()
    plan, out = run_plan(net, [x])
    steps = [(plan.kernels[s.kernel].kind, plan.kernels[s.kernel].op) for s in plan.steps
             if plan.kernels[s.kernel].op != "constant"]
    assert steps == [("generated", "rows"), ("generated", "indexed")], steps
    assert torch.equal(out[0], ReferenceExecutor(net, CPU).run([x])[0])


@pytest.mark.parametrize("mode", ["default", "nd"])
def test_gathers_at_constant_indices_are_index_arithmetic(mode):
    """A gather at constant indices (checked when the layer was made) over a computed tensor: a [3,10,4] table's
    dim 1 at [2,5] indices, or an nd gather of a mask's elements, then a pointwise layer: one indexed kernel."""
    g = torch.Generator().manual_seed(2)
    net = Network("constant gather")
    if mode == "default":
        x = net.add_input("x", torch.float32, (3, 10, 4))
        h = net.add_activation(x, L.ActivationType.RELU).get_output()
        picked = net.add_gather(h, net.add_constant(torch.randint(0, 10, (2, 5), generator=g)).get_output(), 1)
        net.mark_output(net.add_elementwise(picked.get_output(), picked.get_output(),
                                            L.ElementWiseOperation.PROD).get_output())
        value = torch.randn(3, 10, 4, generator=g)
    else:
        x = net.add_input("x", torch.bool, (2, 6))
        at = torch.stack([torch.randint(0, 2, (3, 5), generator=g), torch.randint(0, 6, (3, 5), generator=g)], -1)
        picked = net.add_gather(x, net.add_constant(at).get_output(), 0, L.GatherMode.ND).get_output()
        other = net.add_constant(torch.rand(3, 5, generator=g) > 0.3).get_output()
        net.mark_output(net.add_elementwise(picked, other, L.ElementWiseOperation.AND).get_output())
        value = torch.rand(2, 6, generator=g) > 0.5
    plan, out = run_plan(net, [value])
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ops == ["indexed"] or ops == ["pointwise", "indexed"], ops
    assert torch.equal(out[0], ReferenceExecutor(net, CPU).run([value])[0])


@pytest.mark.parametrize("case", ["input ids", "range too wide"])
def test_gathers_at_indices_not_proved_in_range_stay_on_aten_with_the_reason_reported(case):
    """Token ids (a network input) are not known to be valid rows, and positions up to 13 are not rows of a
    10-row table: ATen's gather checks them, so they stay there, and the fusion report says why."""
    from torchkiln.runtime.backends.cuda import fusion_report

    net = Network("unproved")
    ids = net.add_input("ids", torch.int64, (3, 12))
    indices = ids if case == "input ids" else _positions(net, ids)
    table = net.add_constant(torch.randn(10 if case == "range too wide" else 60, 8)).get_output()
    gathered = net.add_gather(table, indices, 0)
    net.mark_output(net.add_activation(gathered.get_output(), L.ActivationType.RELU).get_output())
    plan = planner.make_plan(net, CPU, BackendOptions(timing_iterations=0))
    assert Kernel("aten", "gather") in plan.kernels
    why = "not proved in range" if case == "input ids" else "may hold values in [1, 13], outside [0, 10)"
    reasons = [e.reason for e in fusion_report.unfused_edges(net, plan)]
    assert any(why in r and gathered.name in r for r in reasons), reasons


@pytest.mark.parametrize("reshape, copies", [((6, 12, 5), True), ((2, 3, 60), False)], ids=["repeat", "view"])
def test_a_repeat_is_one_generated_copy_and_a_reshape_that_views_stays_a_view(reshape, copies):
    """expand([1, 3, 12, 5] -> [2, 3, 12, 5]) then a reshape: merging the broadcast batch dim with the heads (what
    tensor.repeat(2, 1, 1) is) copies, in one generated indexed kernel rather than ATen's strided copy; merging the
    last two dims is a view of the broadcast tensor, and both stay ATen views."""
    net = Network("repeat")
    p = net.add_input("p", torch.float32, (1, 3, 12, 5))
    expanded = net.add_expand(p, (2, 3, 12, 5)).get_output()
    repeated = net.add_shuffle(expanded, reshape_dims=reshape).get_output()
    if copies:  # (12 products an output: a library call)
        q = net.add_input("q", torch.float32, (6, 7, 12))
        out = net.add_matrix_multiply(q, L.MatrixOperation.NONE, repeated, L.MatrixOperation.NONE).get_output()
    else:
        out = net.add_unary(repeated, L.UnaryOperation.ABS).get_output()
    net.mark_output(out)
    values = [torch.randn(1, 3, 12, 5)] + ([torch.randn(6, 7, 12)] if copies else [])
    plan, got = run_plan(net, values)
    steps = [(plan.kernels[s.kernel].op, [net.layers[j].KIND for j in s.layers]) for s in plan.steps]
    assert (("indexed", ["expand", "shuffle"]) in steps) == copies
    assert (("shuffle", ["shuffle"]) in steps) == (not copies)
    ref = ReferenceExecutor(net, CPU).run(values)
    assert (got[0] - ref[0]).abs().max() <= 1e-5 * ref[0].abs().max()


@pytest.mark.parametrize("split", [True, False], ids=["split", "merge"])
def test_tokens_transposed_and_split_into_an_image_are_a_view(split):
    """[N, H * W, C] tokens transposed and split into [N, C, H, W] for a convolution (a vision transformer's
    depthwise feed-forward) is a view, channels-last, which the convolution reads as it is: no copy step. Tokens
    transposed and merged ([N, C, H * W] into [N, C * H * W]) copy, in an indexed kernel."""
    net = Network("tokens")
    x = net.add_input("x", torch.float32, (2, 16, 12))
    if split:
        image = net.add_shuffle(x, first_transpose=(0, 2, 1), reshape_dims=(2, 12, 4, 4)).get_output()
        out = net.add_convolution_nd(image, torch.randn(12, 1, 3, 3), torch.randn(12), stride=(1, 1),
                                     padding=(1, 1), dilation=(1, 1), groups=12).get_output()
    else:
        flat = net.add_shuffle(x, first_transpose=(0, 2, 1), reshape_dims=(2, 192)).get_output()
        out = net.add_unary(flat, L.UnaryOperation.ABS).get_output()
    net.mark_output(out)
    value = torch.randn(2, 16, 12)
    plan, got = run_plan(net, [value])
    ops = [plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant"]
    assert ("indexed" in ops) == (not split)
    ref = ReferenceExecutor(net, CPU).run([value])
    assert (got[0] - ref[0]).abs().max() <= 1e-5 * ref[0].abs().max()


class ChannelSplit(torch.nn.Module):
    """Res2Net's and MixNet's channel split: each convolution reads a channel slice of one map."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(6, 6, 3, padding=1)
        self.b = torch.nn.Conv2d(10, 10, 5, padding=2, groups=10)

    def forward(self, x):
        first, second = x.split([6, 10], dim=1)
        return torch.cat([self.a(first), self.b(second)], 1)


class HeadsFromOneProjection(torch.nn.Module):
    """q, k and v split from one projection as [B, L, 3, H, D] and permuted: their batch dims (B, H) do not merge."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(24, 72)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(2, 10, 3, 2, 12).permute(2, 0, 3, 1, 4).unbind(0)
        return torch.relu(q @ k.transpose(-2, -1)) @ v  # (not softmax: that would become one attention layer)


def test_views_the_library_would_copy_are_packed_by_a_generated_kernel():
    """A channel slice read by a convolution, and a head split whose batch dims do not merge read by a batched
    product: each is one generated indexed step (ATen's strided copy inside the library call is several times
    slower); a head read by another view first, and a product's operand that is a plain view, stay views."""
    for module, shape, expected in ((ChannelSplit(), (2, 16, 7, 7), [["slice"], ["slice"]]),
                                    (HeadsFromOneProjection(), (2, 10, 24), [["slice", "shuffle"]] * 2)):
        module = module.eval()
        data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(shape)], backend="reference")
        net = Engine.deserialize(data).network
        x = torch.randn(shape)
        plan, got = run_plan(net, [x])
        steps = [(plan.kernels[s.kernel].op, [net.layers[j].KIND for j in s.layers]) for s in plan.steps]
        assert [kinds for op, kinds in steps if op == "indexed"][:2] == expected, steps
        with torch.no_grad():
            ref = module(x)
        assert (got[0] - ref).abs().max() <= 1e-4 * ref.abs().max()
