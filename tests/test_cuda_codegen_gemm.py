"""The generated GEMM with a pointwise epilogue (codegen/gemm.py) and the planner's rule that makes it: on the CPU in
Triton's interpreter against the layers' meanings in fp32, and (where CUDA is present) through the CUDA runner."""
import math
import pytest
import torch
import torch.nn.functional as F
from harness import run_plan_eagerly

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import NetworkError  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.ir.tensor import Tensor  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import gemm_tactic, planner  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.epilogue import strides_2d  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.gemm import (Config, GemmLauncher, candidates, gemm_layer,  # noqa: E402
                                                          generate)
from torchkiln.runtime.executor import ReferenceExecutor  # noqa: E402
from torchkiln.runtime.plan import Kernel, Plan, Step  # noqa: E402

H = torch.float16
SMALL = Config(16, 16, 16, 1, 4, 2)  # blocks the interpreter runs quickly; M, N and K below are not multiples
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def close_to(got: torch.Tensor, ref: torch.Tensor) -> None:
    """fp16 against the meaning with the layers' roundings: within two units in the last place of the largest
    value (a rounding of an intermediate may differ by one unit where the GEMM's sums run in another order)."""
    err = (got.double() - ref.double()).abs().max().item()
    assert err <= 2.0 ** -9 * ref.double().abs().max().item(), err
    assert F.cosine_similarity(got.double().flatten(), ref.double().flatten(), dim=0) >= 0.9999


def t(name, *shape, dtype=H):
    return Tensor(name, shape, dtype)


def linear(x: Tensor, n: int, bias: bool = True) -> tuple[L.MatrixMultiplyLayer, Tensor]:
    w = t("w", n, x.shape[-1], dtype=x.dtype)
    y = t("y", *x.shape[:-1], n, dtype=x.dtype)
    layer = L.MatrixMultiplyLayer(name="mm", inputs=[x, w], outputs=[y], weights={"bias": torch.randn(n).half()}
                                  if bias else {}, op0=L.MatrixOperation.NONE, op1=L.MatrixOperation.TRANSPOSE)
    return layer, y


def product_ref(x, w, b):
    """The library product as the network's fp16 tensor: fp32 accumulation, the bias added, rounded once."""
    return (x.float() @ w.float().T + (0 if b is None else b.float())).half().float()


@pytest.mark.parametrize("bias", [True, False])
def test_linear_with_gelu_epilogue(bias):
    x = t("x", 2, 19, 40)
    mm, y = linear(x, 36, bias)
    z = t("z", 2, 19, 36)
    gelu = L.ActivationLayer(name="gelu", inputs=[y], outputs=[z], weights={}, type=L.ActivationType.GELU_ERF)
    run = GemmLauncher(generate(mm, [gelu], [], [z]), mm, SMALL)
    xv, wv = torch.randn(2, 19, 40, device=DEVICE).half(), (torch.randn(36, 40, device=DEVICE) / 6).half()
    b = mm.weights["bias"].to(DEVICE) if bias else None
    got = run(xv, wv, b, [])[0]
    assert got.shape == (2, 19, 36) and got.dtype == H
    close_to(got, F.gelu(product_ref(xv, wv, b)).half())


@pytest.mark.parametrize("dtype", [H, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not CUDA, reason="Triton's interpreter truncates fp32 to bfloat16 where the GPU rounds to nearest"))],
    ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_pointwise_convolution_with_bias_residual_and_relu6(layout, dtype):
    """conv 1x1 + bias -> + residual -> clip(0, 6): the GEMM over channels-last pixels; a contiguous input is laid
    out first, and the output is channels-last either way."""
    x, y, r, s, z = (t(name, 3, 20 if name == "x" else 24, 5, 7, dtype=dtype) for name in "xyrsz")
    kernel = (torch.randn(24, 20, 1, 1) / 4).to(dtype)
    conv = L.ConvolutionLayer(name="conv", inputs=[x], outputs=[y], weights={"kernel": kernel, "bias": torch.randn(24)
                              .to(dtype)}, stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    add = L.ElementWiseLayer(name="add", inputs=[y, r], outputs=[s], weights={}, op=L.ElementWiseOperation.SUM)
    clip = L.ActivationLayer(name="clip", inputs=[s], outputs=[z], weights={}, type=L.ActivationType.CLIP,
                             alpha=0.0, beta=6.0)
    run = GemmLauncher(generate(conv, [add, clip], [r], [z]), conv, SMALL)
    xv = torch.randn(3, 20, 5, 7, device=DEVICE).to(dtype)
    if layout == "channels_last":
        xv = xv.contiguous(memory_format=torch.channels_last)
    rv = torch.randn(3, 24, 5, 7, device=DEVICE).to(dtype)
    w, b = kernel.to(DEVICE), conv.weights["bias"].to(DEVICE)
    got = run(xv, w, b, [rv])[0]
    assert got.dtype == dtype
    ref = F.conv2d(xv.float(), w.float(), b.float()).to(dtype).float()
    expected = (ref + rv.float()).to(dtype).float().clamp(0, 6)
    if dtype == H:
        close_to(got, expected.half())
    else:  # bfloat16's unit in the last place is 8 times fp16's
        assert (got.double() - expected.double()).abs().max() <= 2.0 ** -6 * expected.abs().max()
    assert got.is_contiguous(memory_format=torch.channels_last)


def test_only_a_float_products_activations_divide_approximately():
    """In a half-precision GEMM's epilogue an activation's division is the GPU's approximate one (`_fast_div`); a
    division layer's quotient, a quantized product's epilogue and a pointwise kernel keep IEEE division."""
    from torchkiln.runtime.backends.cuda.codegen import pointwise

    x = t("x", 4, 40)
    mm, y = linear(x, 36)
    z, q = t("z", 4, 36), t("q", 4, 36)
    silu = L.ActivationLayer(name="silu", inputs=[y], outputs=[z], weights={}, type=L.ActivationType.SILU)
    div = L.ElementWiseLayer(name="div", inputs=[z, y], outputs=[q], weights={}, op=L.ElementWiseOperation.DIV)

    def body(source: str) -> str:
        return source.split("def gemm_epilogue_kernel", 1)[1] if "gemm_epilogue_kernel" in source else \
            source.split("@triton.jit", 2)[2]

    both = body(generate(mm, [silu, div], [], [q]).source)
    assert both.count("_fast_div(") == 1 and both.count("tl.div_rn(") == 1
    assert "_fast_div(" not in body(generate(mm, [silu], [], [z], quant_type=torch.int8).source)
    assert "_fast_div(" not in body(pointwise.generate([silu], [y], [z]).source)


def test_epilogue_operands_broadcast_and_several_outputs():
    """A per-column constant, a residual broadcast over the batch (read after a copy to the output's layout) and
    two outputs (the sum and its ReLU) from one GEMM."""
    x = t("x", 2, 9, 24)
    mm, y = linear(x, 20)
    c, cv = t("c", 20), torch.randn(20).half()
    const = L.ConstantLayer(name="c", inputs=[], outputs=[c], weights={"value": cv})
    r, s, u, z = t("r", 1, 9, 20), t("s", 2, 9, 20), t("u", 2, 9, 20), t("z", 2, 9, 20)
    mul = L.ElementWiseLayer(name="mul", inputs=[y, c], outputs=[u], weights={}, op=L.ElementWiseOperation.PROD)
    add = L.ElementWiseLayer(name="add", inputs=[u, r], outputs=[s], weights={}, op=L.ElementWiseOperation.SUM)
    relu = L.ActivationLayer(name="relu", inputs=[s], outputs=[z], weights={}, type=L.ActivationType.RELU)
    run = GemmLauncher(generate(mm, [const, mul, add, relu], [r], [s, z]), mm, SMALL)
    xv, wv = torch.randn(2, 9, 24, device=DEVICE).half(), (torch.randn(20, 24, device=DEVICE) / 5).half()
    rv = torch.randn(1, 9, 20, device=DEVICE).half()
    b = mm.weights["bias"].to(DEVICE)
    got_s, got_z = run(xv, wv, b, [rv])
    ref_u = (product_ref(xv, wv, b) * cv.to(DEVICE).float()).half().float()
    ref_s = (ref_u + rv.float()).half()
    close_to(got_s, ref_s)
    close_to(got_z, ref_s.float().relu().half())


def test_strides_2d():
    cl = torch.empty(2, 8, 3, 5).contiguous(memory_format=torch.channels_last)
    assert strides_2d(cl, cl.shape, (0, 2, 3), 1) == (8, 1)
    assert strides_2d(torch.empty(2, 8, 3, 5), (2, 8, 3, 5), (0, 2, 3), 1) is None  # NCHW pixels are not rows
    assert strides_2d(torch.empty(8, 1, 1), (2, 8, 3, 5), (0, 2, 3), 1) == (0, 1)  # a per-channel vector
    assert strides_2d(torch.empty(()), (4, 6), (0,), 1) == (0, 0)
    assert strides_2d(torch.empty(3, 1), (3, 7), (0,), 1) == (1, 0)
    assert strides_2d(torch.empty(1, 3, 7), (2, 3, 7), (0, 1), 2) is None  # repeats over the batch: no one stride


def test_which_layers_are_generated_gemms_and_configurations():
    x = t("x", 4, 16, 3, 3)
    conv3 = L.ConvolutionLayer(name="c3", inputs=[x], outputs=[t("y", 4, 8, 1, 1)], weights={"kernel": torch.randn(
        8, 16, 3, 3).half()}, stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    assert "1x1" in gemm_layer(conv3)
    mm32, _ = linear(t("x", 4, 8, dtype=torch.float32), 8)
    assert "half precision" in gemm_layer(mm32)
    assert Config.parse(SMALL.text()) == SMALL
    with pytest.raises(NetworkError, match="malformed GEMM tile configuration"):
        Config.parse("64,64")
    assert all(candidates(m, 3072, 768)[0].block_m >= 64 for m in (1, 300, 10 ** 6))  # the fitted tile
    narrow = candidates(401408, 16, 24)[0]  # an inverted residual's first projection at batch 32: taller, narrower
    assert (narrow.block_m, narrow.block_n, narrow.block_k) == (256, 16, 32)


@pytest.mark.parametrize("m, n, k, sms", [(1, 3072, 768, 132), (49, 1152, 192, 132), (196, 40, 240, 132),
                                          (49, 1152, 192, 16), (10 ** 6, 3072, 768, 132)])
def test_a_filling_tile_is_offered_for_products_that_leave_multiprocessors_idle(m, n, k, sms):
    fitted, *rest = [c for c in candidates(m, n, k, sms) if c.split_k == 1]
    programs = [math.ceil(m / c.block_m) * math.ceil(n / c.block_n) for c in (fitted, *rest)]
    if programs[0] < sms:  # the fitted tile leaves some idle: the other fills them, or is as small as a tile goes
        (filling,) = rest
        assert programs[1] >= sms or filling.block_m == filling.block_n == 16
        assert filling.block_m <= max(16, 1 << (m - 1).bit_length()) and filling.block_k <= 128
    for c in rest:  # its pipeline fits in shared memory
        assert (c.block_m + c.block_n) * c.block_k * 2 * c.stages <= 192 << 10


@pytest.mark.parametrize("split", [2, 3, 8])
def test_split_k_sums_its_parts_in_order_and_resets_its_counters(split):
    """K split over programs: each stores its part, the last of a tile sums them in order and applies the epilogue
    (GELU here). The result is the reference's within fp16 rounding, the same on every call (the sum's order does
    not depend on which program was last), and the tiles' counters are back at 0 for the next launch."""
    x = t("x", 3, 7, 200)
    mm, y = linear(x, 36)
    z = t("z", 3, 7, 36)
    gelu = L.ActivationLayer(name="gelu", inputs=[y], outputs=[z], weights={}, type=L.ActivationType.GELU_ERF)
    run = GemmLauncher(generate(mm, [gelu], [], [z]), mm, Config(16, 16, 16, 1, 4, 2, split))
    xv, wv = torch.randn(3, 7, 200, device=DEVICE).half(), (torch.randn(36, 200, device=DEVICE) / 12).half()
    b = mm.weights["bias"].to(DEVICE)
    first, again = run(xv, wv, b, [])[0], run(xv, wv, b, [])[0]
    close_to(first, F.gelu(product_ref(xv, wv, b)).half())
    assert torch.equal(first, again)
    ((parts, counts),) = run._workspaces.values()
    assert parts.numel() == split * 21 * 36 and counts.numel() == 2 * 3 and not counts.any()


@pytest.mark.parametrize("m, n, k, sms, split", [(32, 64, 1536, 132, 12), (1, 384, 1536, 132, 4), (32, 96, 384, 132, 3),
                                                 (128, 768, 768, 132, None), (32, 1536, 64, 132, None),
                                                 (4096, 768, 3072, 132, None), (32, 64, 1536, 1, None)])
def test_a_split_k_tile_is_offered_for_few_tiles_over_a_long_k(m, n, k, sms, split):
    """A product of few output tiles and a long K (a squeeze-excitation's reduction) also times the filling tile
    with K split: no more programs than multiprocessors, no part of K left empty."""
    found = [c for c in candidates(m, n, k, sms) if c.split_k > 1]
    if split is None:
        assert not found
        return
    (c,) = found
    blocks, per = math.ceil(k / c.block_k), math.ceil(math.ceil(k / c.block_k) / c.split_k)
    assert c.split_k == split and per * (c.split_k - 1) < blocks
    assert math.ceil(m / c.block_m) * math.ceil(n / c.block_n) * c.split_k <= sms


def test_a_balanced_tile_is_offered_for_large_products():
    assert Config(64, 64, 64, 4, 4) in candidates(25088, 512, 128)
    assert Config(64, 64, 32, 4, 4) in candidates(100352, 144, 24)  # K blocks no deeper than the product
    assert Config(64, 64, 64, 4, 4) not in candidates(128, 768, 768)  # a small product: the filling tile's


# ---- the planner's rule, through bind_steps (Triton's interpreter on the CPU) ----------------------------------

def ffn(n_in: int = 24, n_hidden: int = 40) -> Network:
    """x @ W1.T + b1 -> GELU -> x @ W2.T + b2, fp16."""
    net = Network("ffn")
    x = net.add_input("x", H, (2, 7, n_in))
    h = x
    for k, n in enumerate((n_hidden, n_in)):
        w = net.add_constant((torch.randn(n, h.shape[-1]) / 5).half()).get_output()
        h = net.add_layer(L.MatrixMultiplyLayer, [h, w], weights={"bias": torch.randn(n).half()},
                          op1=L.MatrixOperation.TRANSPOSE).get_output()
        if k == 0:
            h = net.add_activation(h, L.ActivationType.GELU_ERF).get_output()
    net.mark_output(h)
    return net


def inverted_residual() -> Network:
    """1x1 expand + ReLU6 -> 1x1 project + residual, fp16 (MobileNet-v2's block without its depthwise step)."""
    net = Network("inverted_residual")
    x = net.add_input("x", H, (2, 8, 5, 5))
    e = net.add_convolution_nd(x, (torch.randn(24, 8, 1, 1) / 3).half(), torch.randn(24).half(), stride=(1, 1),
                               padding=(0, 0), dilation=(1, 1)).get_output()
    e = net.add_activation(e, L.ActivationType.CLIP, 0.0, 6.0).get_output()
    p = net.add_convolution_nd(e, (torch.randn(8, 24, 1, 1) / 5).half(), torch.randn(8).half(), stride=(1, 1),
                               padding=(0, 0), dilation=(1, 1)).get_output()
    net.mark_output(net.add_elementwise(p, x, L.ElementWiseOperation.SUM).get_output())
    return net


def plan_with(network: Network, monkeypatch, config: str | None) -> Plan:
    monkeypatch.setattr(gemm_tactic, "choose", lambda network, requests, *args: [config] * len(requests))
    return planner.make_plan(network, torch.device("cpu"), BackendOptions(timing_iterations=0))


@pytest.mark.skipif(CUDA, reason="the CPU plan runs in Triton's interpreter")
@pytest.mark.parametrize("build", [ffn, inverted_residual], ids=["ffn", "inverted_residual"])
def test_planned_gemm_steps_match_the_reference(build, monkeypatch):
    network = build()
    plan = plan_with(network, monkeypatch, SMALL.text())
    ops = [plan.kernels[s.kernel].op for s in plan.steps]
    expected = {"ffn": ["matrix_multiply", "pointwise", "matrix_multiply"],  # linear layers stay on cuBLAS
                "inverted_residual": ["gemm", "gemm"]}[network.name]
    assert [op for op in ops if op not in ("constant",)] == expected
    xs = [torch.randn(network.inputs[0].shape).half()]
    got = run_plan_eagerly(network, plan, xs)[0]
    close_to(got, ReferenceExecutor(network, torch.device("cpu")).run(xs)[0])


def test_the_library_steps_stay_where_the_tactic_says_so(monkeypatch):
    plan = plan_with(inverted_residual(), monkeypatch, None)
    assert [plan.kernels[s.kernel].op for s in plan.steps] == ["conv_epilogue", "conv_epilogue"]


def test_a_gemm_row_of_another_layer_is_refused_by_name():
    net = Network("not_a_product")
    x = net.add_input("x", H, (2, 8))
    net.mark_output(net.add_activation(x, L.ActivationType.RELU).get_output())
    plan = Plan(planner.target(torch.device("cpu")), [Kernel("generated", "gemm", (("config", SMALL.text()),))],
                [Step(0, (0,))])
    with pytest.raises(NetworkError, match="is not a generated GEMM"):
        run_plan_eagerly(net, plan, [torch.randn(2, 8).half()])


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_generated_gemm_engine_on_the_gpu(monkeypatch):
    """The CUDA runner (captured in a CUDA graph) with every product a generated GEMM of a Hopper-sized tile."""
    from torchkiln.runtime.backends.cuda.runner import CudaRunner

    network = inverted_residual()
    monkeypatch.setattr(gemm_tactic, "choose",
                        lambda network, requests, *args: [Config(64, 64, 64, 3, 4).text()] * len(requests))
    device = torch.device("cuda")
    plan = planner.make_plan(network, device, BackendOptions(timing_iterations=0))
    assert "gemm" in {plan.kernels[s.kernel].op for s in plan.steps}
    runner = CudaRunner(network, plan, device, BackendOptions())
    xs = [torch.randn(network.inputs[0].shape).half()]
    ref = ReferenceExecutor(network, torch.device("cpu")).run(xs)[0]
    for _ in range(3):  # eager and capture, then replays
        got = runner.run([xs[0].to(device)])[0]
    close_to(got.cpu(), ref)
