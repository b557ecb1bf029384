"""The generated depthwise convolution with its bias and pointwise epilogue (codegen/depthwise.py) and the planner's
rule that offers it: on the CPU in Triton's interpreter against F.conv2d and the layers' meanings, and (where CUDA
is present) through the CUDA runner."""
import pytest
import torch
import torch.nn.functional as F
from harness import run_plan_eagerly

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import EngineInputError, NetworkError  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.ir.tensor import Tensor  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import gemm_tactic, planner  # noqa: E402
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.depthwise import (Config, DepthwiseLauncher, candidates,  # noqa: E402
                                                               depthwise_layer, generate, lay_out)
from torchkiln.runtime.executor import ReferenceExecutor  # noqa: E402
from torchkiln.runtime.plan import Kernel, Plan, Step  # noqa: E402

H = torch.float16
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
SMALL = Config(2, 8, 32, 1)  # a tile the interpreter runs quickly; widths and channels below are not multiples
ACT = L.ActivationType


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def t(name, *shape, dtype=torch.float32):
    return Tensor(name, shape, dtype)


def depthwise(c: int, k: int, stride: int, padding: int, dilation: int, dtype=torch.float32, bias: bool = True,
              size: tuple[int, int] = (9, 11), batch: int = 2) -> L.ConvolutionLayer:
    """A depthwise convolution layer of `c` channels and a k x k window over [batch, c, *size]."""
    kernel = (torch.randn(c, 1, k, k) / k).to(dtype)
    out = F.conv2d(torch.zeros(1, c, *size), kernel.float(), None, stride, padding, dilation, c).shape[2:]
    weights = {"kernel": kernel, **({"bias": torch.randn(c).to(dtype)} if bias else {})}
    return L.ConvolutionLayer(name="dw", inputs=[t("x", batch, c, *size, dtype=dtype)],
                              outputs=[t("y", batch, c, *out, dtype=dtype)], weights=weights, stride=(stride, stride),
                              padding=(padding, padding), dilation=(dilation, dilation), groups=c)


def activation(x: Tensor, kind: L.ActivationType, **args) -> L.ActivationLayer:
    return L.ActivationLayer(name=kind.name.lower(), inputs=[x], outputs=[t("z", *x.shape, dtype=x.dtype)],
                             weights={}, type=kind, **args)


def run(conv: L.ConvolutionLayer, rest: list[L.Layer], inputs: list[Tensor], x: torch.Tensor,
        others: list[torch.Tensor] = (), config: Config = SMALL) -> torch.Tensor:
    outputs = [rest[-1].outputs[0] if rest else conv.outputs[0]]
    launch = DepthwiseLauncher(conv, rest, inputs, outputs, config)
    bias = conv.weights.get("bias")
    return launch(x, lay_out(conv.weights["kernel"]).to(DEVICE), None if bias is None else bias.to(DEVICE),
                  list(others))[0]


def conv_ref(conv: L.ConvolutionLayer, x: torch.Tensor) -> torch.Tensor:
    bias = conv.weights.get("bias")
    return F.conv2d(x.double(), conv.weights["kernel"].to(x.device).double(),
                    None if bias is None else bias.to(x.device).double(), conv.stride, conv.padding, conv.dilation,
                    conv.groups)


def tight(got: torch.Tensor, ref: torch.Tensor) -> None:
    """fp32: within 1e-4 of the largest reference value (the sums run in another order than ATen's)."""
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert ref.abs().max() > 0
    assert (got.double() - ref.double()).abs().max() <= 1e-4 * ref.double().abs().max()


# (window, stride, padding, dilation, output rows a program)
WINDOWS = [(3, 1, 1, 1, 1), (3, 2, 1, 1, 2), (5, 1, 2, 1, 4), (5, 2, 2, 1, 1), (7, 1, 3, 1, 4), (7, 1, 3, 1, 1),
           (5, 1, 4, 2, 2), (3, 2, 0, 1, 4), (3, 1, 2, 2, 1)]


@pytest.mark.parametrize("k,stride,padding,dilation,rows", WINDOWS)
def test_depthwise_convolution_with_bias_is_conv2d(k, stride, padding, dilation, rows):
    """20 channels in blocks of 32 and 11 columns in blocks of 8: both edges masked."""
    conv = depthwise(20, k, stride, padding, dilation)
    x = torch.randn(conv.inputs[0].shape, device=DEVICE).contiguous(memory_format=torch.channels_last)
    got = run(conv, [], [], x, config=Config(rows, 8, 32, 1))
    tight(got, conv_ref(conv, x))
    assert got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("kind,args,meaning", [
    (ACT.RELU, {}, torch.relu),
    (ACT.SILU, {}, F.silu),
    (ACT.HARD_SWISH, {}, F.hardswish),
    (ACT.CLIP, {"alpha": 0.0, "beta": 6.0}, lambda v: v.clamp(0, 6)),
], ids=["relu", "silu", "hardswish", "relu6"])
def test_epilogue_activations(kind, args, meaning):
    """The activations after depthwise convolutions in inverted-residual blocks (their batch norms folded into
    the bias), from an NCHW input (laid out channels-last first), without a bias too."""
    for bias in (True, False) if kind == ACT.RELU else (True,):
        conv = depthwise(24, 5, 2, 2, 1, bias=bias, size=(7, 9))
        act = activation(conv.outputs[0], kind, **args)
        x = torch.randn(conv.inputs[0].shape, device=DEVICE)
        tight(run(conv, [act], [], x), meaning(conv_ref(conv, x)))


def test_residual_epilogue_and_two_outputs():
    """dw(x) + bias + r, and its ReLU: a residual read through the output's strides, two outputs of one pass."""
    conv = depthwise(12, 3, 1, 1, 1, size=(6, 7))
    y = conv.outputs[0]
    r, s, z = t("r", *y.shape), t("s", *y.shape), t("z", *y.shape)
    add = L.ElementWiseLayer(name="add", inputs=[y, r], outputs=[s], weights={}, op=L.ElementWiseOperation.SUM)
    relu = L.ActivationLayer(name="relu", inputs=[s], outputs=[z], weights={}, type=ACT.RELU)
    launch = DepthwiseLauncher(conv, [add, relu], [r], [s, z], SMALL)
    x, rv = torch.randn(y.shape, device=DEVICE), torch.randn(y.shape, device=DEVICE)
    got_s, got_z = launch(x, lay_out(conv.weights["kernel"]).to(DEVICE), conv.weights["bias"].to(DEVICE), [rv])
    ref = conv_ref(conv, x) + rv.double()
    tight(got_s, ref)
    tight(got_z, ref.relu())


def test_half_precision_rounds_as_the_library_output():
    """fp16 in, fp32 sums, the bias added and the sum rounded to fp16 before the epilogue (as cuDNN's output
    tensor is), then the SiLU rounded once: within two units in the last place of the largest value."""
    conv = depthwise(32, 7, 1, 3, 1, dtype=H, size=(8, 9))
    act = activation(conv.outputs[0], ACT.SILU)
    x = torch.randn(conv.inputs[0].shape, device=DEVICE).half().contiguous(memory_format=torch.channels_last)
    got = run(conv, [act], [], x, config=Config(4, 8, 32, 4))
    assert got.dtype == H
    ref = F.silu(conv_ref(conv, x).half().float()).half()
    err = (got.double() - ref.double()).abs().max().item()
    assert err <= 2.0 ** -9 * ref.double().abs().max().item(), err


def test_which_layers_are_generated_depthwise_convolutions():
    assert depthwise_layer(depthwise(8, 3, 1, 1, 1)) is None
    assert depthwise_layer(depthwise(8, 3, 1, 1, 1, dtype=H)) is None
    dense = L.ConvolutionLayer(name="c", inputs=[t("x", 1, 8, 5, 5)], outputs=[t("y", 1, 8, 3, 3)],
                               weights={"kernel": torch.randn(8, 8, 3, 3)}, stride=(1, 1), padding=(0, 0),
                               dilation=(1, 1))
    assert "one group per channel" in depthwise_layer(dense)
    multiplier = L.ConvolutionLayer(name="c", inputs=[t("x", 1, 8, 5, 5)], outputs=[t("y", 1, 16, 3, 3)],
                                    weights={"kernel": torch.randn(16, 1, 3, 3)}, stride=(1, 1), padding=(0, 0),
                                    dilation=(1, 1), groups=8)
    assert "one output channel per group" in depthwise_layer(multiplier)
    relu = activation(t("x", 2, 3), ACT.RELU)
    assert "not a convolution" in depthwise_layer(relu)
    with pytest.raises(NetworkError, match="is not a generated depthwise convolution"):
        generate(multiplier, [], [], [multiplier.outputs[0]])
    assert Config.parse(SMALL.text()) == SMALL
    for bad in ("2,4", "1,6,16,4", "0,4,16,4", "a,b,c,d"):
        with pytest.raises(NetworkError, match="malformed depthwise tile configuration"):
            Config.parse(bad)


def test_candidate_tiles_by_output_size():
    """A large output gets one, two and four rows of 16 columns by 64 channels; a small one (batch 1, 7x7) tiles
    narrow enough to give the GPU work, and a window never gets more rows than the output has."""
    large = candidates(32, 192, 56, 56)
    assert [(c.rows, c.block_w, c.block_c, c.warps) for c in large] == [(1, 16, 64, 4), (2, 16, 64, 4),
                                                                        (4, 16, 64, 4)]
    small = candidates(1, 960, 7, 7)
    assert all(c.rows * c.block_w * c.block_c <= 256 for c in small)
    assert candidates(1, 8, 1, 1) == [Config(1, 1, 8, 1)]


def test_kernel_text_loops_over_input_rows_shared_by_output_rows():
    """A 7x7 of stride 1 over four output rows loops over ten input rows (not 4 x 7), loading seven columns of each
    once and adding them to every output row the input row reaches; stride, padding and dilation are constants of
    the source."""
    conv = depthwise(16, 7, 1, 3, 1)
    source = generate(conv, [], [], [conv.outputs[0]], rows=4).source
    assert "for i in range(10):" in source and source.count("= tl.load(x_row + col") == 7
    assert all(source.count(f"acc{r} += ") == 7 for r in range(4))
    assert "if (i < 7):" in source and "if ((i - 3) >= 0):" in source  # the first and the last row's reach
    assert "ih = top * 1 + (i - 3)" in source and "iw6 = ow * 1 + 3" in source
    conv = depthwise(16, 5, 2, 4, 2)
    dilated = generate(conv, [], [], [conv.outputs[0]], rows=2).source  # row 0 reads 0, 2.. 8; row 1 reads 2, 4.. 10
    assert "for i in range(11):" in dilated and "iw4 = ow * 2 + 4" in dilated
    assert "if ((i - 2) >= 0) & ((i - 2) % 2 == 0):" in dilated and "w_row = w_c + ((i - 2) // 2) * 5 * C" in dilated


def test_inputs_that_do_not_fit_are_refused():
    conv = depthwise(8, 5, 1, 0, 1, size=(9, 9))
    launch = DepthwiseLauncher(conv, [], [], [conv.outputs[0]], SMALL)
    w = lay_out(conv.weights["kernel"]).to(DEVICE)
    with pytest.raises(EngineInputError, match="smaller than its window"):
        launch(torch.randn(1, 8, 3, 9, device=DEVICE), w, None, [])
    with pytest.raises(EngineInputError, match="does not fit a kernel of 8 channels"):
        launch(torch.randn(1, 6, 9, 9, device=DEVICE), w, None, [])


# ---- the planner's rule, through bind_steps (Triton's interpreter on the CPU) ----------------------------------

def separable(dtype=H, act: L.ActivationType = ACT.HARD_SWISH) -> Network:
    """1x1 expand + ReLU6 -> depthwise 5x5 of stride 2 + bias + `act` -> 1x1 project (a depthwise-separable block),
    and a depthwise 3x3 without bias or epilogue after it."""
    net = Network("separable")
    x = net.add_input("x", dtype, (2, 8, 11, 11))
    e = net.add_convolution_nd(x, (torch.randn(24, 8, 1, 1) / 3).to(dtype), torch.randn(24).to(dtype),
                               stride=(1, 1), padding=(0, 0), dilation=(1, 1)).get_output()
    e = net.add_activation(e, ACT.CLIP, 0.0, 6.0).get_output()
    d = net.add_convolution_nd(e, (torch.randn(24, 1, 5, 5) / 5).to(dtype), torch.randn(24).to(dtype),
                               stride=(2, 2), padding=(2, 2), dilation=(1, 1), groups=24).get_output()
    d = net.add_activation(d, act).get_output()
    p = net.add_convolution_nd(d, (torch.randn(16, 24, 1, 1) / 5).to(dtype), torch.randn(16).to(dtype),
                               stride=(1, 1), padding=(0, 0), dilation=(1, 1)).get_output()
    q = net.add_convolution_nd(p, (torch.randn(16, 1, 3, 3) / 3).to(dtype), None, stride=(1, 1), padding=(2, 2),
                               dilation=(2, 2), groups=16).get_output()
    net.mark_output(q)
    return net


def plan_with(network: Network, monkeypatch, config: str | None, offered: list | None = None) -> Plan:
    """The CPU plan with the tactic answering `config` for every depthwise request (and the library for GEMMs)."""
    def choose(network, requests, *args):
        if offered is not None:
            offered.extend(requests)
        return [config if r.kind == "depthwise" else None for r in requests]

    monkeypatch.setattr(gemm_tactic, "choose", choose)
    return planner.make_plan(network, torch.device("cpu"), BackendOptions(timing_iterations=0))


def test_the_tactic_is_offered_every_depthwise_step(monkeypatch):
    """Both depthwise convolutions are requests of kind "depthwise": the first with its bias and hardswish (its
    `conv_epilogue` step), the second alone (a plain convolution step); the 1x1 convolutions are GEMM requests."""
    network, offered = separable(), []
    plan = plan_with(network, monkeypatch, None, offered)
    kinds = [(r.kind, network.layers[r.product].groups, len(r.epilogue)) for r in offered]
    assert sorted(kinds) == [("depthwise", 16, 0), ("depthwise", 24, 1), ("gemm", 1, 0), ("gemm", 1, 1)]
    library = {r.library[0][0].op for r in offered if r.kind == "depthwise"}
    assert library == {"conv_epilogue", "convolution"}
    assert "depthwise" not in {k.op for k in plan.kernels}  # the tactic kept the library steps


def test_an_nchw_library_step_pays_for_its_output_layout_where_a_convolution_reads_it(monkeypatch):
    """The tactic times cuDNN's NCHW step with the channels-last copy its reading convolution makes (the generated
    kernel writes channels-last); not for a channels-last step, nor for an output no convolution reads."""
    import dataclasses

    network, offered = separable(), []
    plan_with(network, monkeypatch, None, offered)
    first, last = sorted((r for r in offered if r.kind == "depthwise"), key=lambda r: r.product)
    readers = planner._Graph(network).readers

    def nchw(request):
        (kernel, members), = request.library
        return dataclasses.replace(request, library=((Kernel(kernel.kind, kernel.op, (("channels_last", False),)),
                                                      members),))

    assert gemm_tactic._converts_output(network, nchw(first), readers)
    assert not gemm_tactic._converts_output(network, first, readers)
    assert not gemm_tactic._converts_output(network, nchw(last), readers)  # the network's output


def test_a_depthwise_row_of_another_layer_is_refused_by_name():
    net = Network("not_depthwise")
    x = net.add_input("x", H, (1, 8, 5, 5))
    net.mark_output(net.add_convolution_nd(x, torch.randn(8, 8, 3, 3).half(), None, stride=(1, 1), padding=(1, 1),
                                           dilation=(1, 1)).get_output())
    plan = Plan(planner.target(torch.device("cpu")), [Kernel("generated", "depthwise", (("config", SMALL.text()),))],
                [Step(0, (0,))])
    with pytest.raises(NetworkError, match="'.*' is not a generated depthwise convolution: only a 2-D convolution"):
        run_plan_eagerly(net, plan, [torch.randn(1, 8, 5, 5).half()])


@pytest.mark.skipif(CUDA, reason="the CPU plan runs in Triton's interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, H], ids=["fp32", "fp16"])
def test_planned_depthwise_steps_match_the_reference(dtype, monkeypatch):
    network = separable(dtype, ACT.SILU)
    plan = plan_with(network, monkeypatch, SMALL.text())
    steps = [(plan.kernels[s.kernel].op, len(s.layers)) for s in plan.steps]
    assert [s for s in steps if s[0] == "depthwise"] == [("depthwise", 2), ("depthwise", 1)]
    assert plan.kernels[next(s.kernel for s in plan.steps if plan.kernels[s.kernel].op == "depthwise")].option(
        "config") == SMALL.text()
    xs = [torch.randn(network.inputs[0].shape).to(dtype)]
    got = run_plan_eagerly(network, plan, xs)[0]
    ref = ReferenceExecutor(network, torch.device("cpu")).run(xs)[0]
    assert ref.abs().max() > 0
    if dtype == torch.float32:
        tight(got, ref.double())
    else:  # four roundings to fp16 in a row, each possibly one unit apart
        err = (got.double() - ref.double()).abs().max().item()
        assert err <= 2.0 ** -8 * ref.double().abs().max().item(), err
        assert F.cosine_similarity(got.double().flatten(), ref.double().flatten(), dim=0) >= 0.9999


class _Block(torch.nn.Module):
    """A depthwise-separable block: 1x1 expand + ReLU, depthwise k x k + SiLU, 1x1 project (+ the input)."""

    def __init__(self, c=32, hidden=96, k=7, stride=1):
        super().__init__()
        self.expand = torch.nn.Conv2d(c, hidden, 1)
        self.depthwise = torch.nn.Conv2d(hidden, hidden, k, stride=stride, padding=k // 2, groups=hidden)
        self.project = torch.nn.Conv2d(hidden, c, 1)
        self.stride = stride

    def forward(self, x):
        y = self.project(F.silu(self.depthwise(torch.relu(self.expand(x)))))
        return y + x if self.stride == 1 else y


def _compiled_fp16(model: torch.nn.Module, x: torch.Tensor):
    import torchkiln

    return torchkiln.compile(model.half(), [x.half()], enabled_precisions={torch.float16})


def _ops(compiled) -> list[str]:
    from torchkiln.runtime.execute_op import engine_from_blob
    from torchkiln.stitching.stitch import ENGINE_ATTR

    plan = engine_from_blob(getattr(compiled, ENGINE_ATTR.format(0))).plans[0]
    return [plan.kernels[s.kernel].op for s in plan.steps]


def _close_fp16(got: torch.Tensor, ref: torch.Tensor) -> None:
    cos = F.cosine_similarity(got.double().flatten(), ref.double().flatten(), dim=0)
    assert cos >= 0.999 and (got.float() - ref.float()).abs().max() <= 1e-2 * ref.float().abs().max()


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("k,stride", [(7, 1), (3, 2), (5, 1)])
def test_generated_depthwise_engine_on_the_gpu(k, stride, monkeypatch, tmp_path):
    """The compiled module (CUDA graphs) with its depthwise convolution generated, fp16 against eager fp32."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    real = gemm_tactic.choose
    monkeypatch.setattr(gemm_tactic, "choose", lambda network, requests, *args: [
        Config(2, 16, 64, 4).text() if r.kind == "depthwise" else c
        for r, c in zip(requests, real(network, requests, *args))])
    model = _Block(k=k, stride=stride).eval().cuda()
    x = torch.randn(4, 32, 28, 28, device="cuda")
    with torch.no_grad():
        ref = model(x)
        compiled = _compiled_fp16(model, x)
        assert "depthwise" in _ops(compiled)
        for _ in range(3):  # eager and capture, then replays
            got = compiled(x.half())
    _close_fp16(got, ref)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_depthwise_tactic_is_timed_and_cached(tmp_path, monkeypatch):
    """Without a forced choice the build times the generated kernel against cuDNN's step and caches the choice
    (a tile configuration, or "" for the library); the engine matches eager either way."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    from torchkiln.runtime.backends.cuda.timing import TimingCache

    model = _Block(c=48, hidden=192, k=7).eval().cuda()
    x = torch.randn(8, 48, 56, 56, device="cuda")
    with torch.no_grad():
        ref = model(x)
        compiled = _compiled_fp16(model, x)
        got = compiled(x.half())
    choices = [c for key, c in TimingCache.load().entries.items() if '"depthwise"' in key]
    assert len(choices) == 1
    assert ("depthwise" in _ops(compiled)) == bool(choices[0])
    _close_fp16(got, ref)
