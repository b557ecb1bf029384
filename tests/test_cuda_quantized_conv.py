"""The CUDA backend's quantized convolutions (codegen/quantized_conv.py, quant_kernels.quantized_convolutions) and
its generated dequantize and zero-point quantize: which layers the planner gives them, and their values against the
reference meanings (Triton's interpreter on the CPU; the GPU tests where there is one)."""
import pytest
import torch
from harness import run_plan_eagerly

import torchkiln
from torchkiln.builder.passes.quantize import quantize_weight
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import dequantize
from torchkiln.runtime.backends import BackendOptions
from torchkiln.runtime.backends.cuda import gemm_tactic, planner
from torchkiln.runtime.backends.cuda.quant_kernels import GENERATED_CONV_OP
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.plan import check_steps

I8, F8 = torch.int8, torch.float8_e4m3fn
CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
on_the_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU plan runs in Triton's interpreter")
pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _fake_quantize(net: Network, x, scale: float, zero: int, quant_type: torch.dtype):
    weights = {"scale": torch.tensor([scale]), **({"zero_point": torch.tensor([zero], dtype=I8)} if zero else {})}
    q = net.add_layer(L.QuantizeLayer, [x], weights=weights, quant_type=quant_type, divide=True).get_output()
    return net.add_layer(L.DequantizeLayer, [q], weights=dict(weights), quant_type=quant_type).get_output()


def _conv(net: Network, x, cin: int, cout: int, k: int, stride: int, pad: int, dilation: int = 1, zero: int = 0,
          scale: float = 0.05, quant_type: torch.dtype = I8, groups: int = 1, gen: torch.Generator | None = None):
    """Quantize/dequantize, then a convolution of a kernel quantized per output channel, with a bias."""
    gen = gen or torch.Generator().manual_seed(cin * 100 + cout)
    dq = _fake_quantize(net, x, scale, zero, quant_type)
    w = torch.randn(cout, cin // groups, k, k, generator=gen) / (cin * k * k) ** 0.5
    q, s = quantize_weight(w, 0, quant_type)
    conv = net.add_convolution_nd(dq, dequantize(q, s.reshape(-1, 1, 1, 1), None), torch.randn(cout, generator=gen),
                                  stride=(stride, stride), padding=(pad, pad), dilation=(dilation, dilation),
                                  groups=groups)
    conv.weights = {**conv.weights, "kernel_scale": s}
    conv.kernel_type = quant_type
    return conv.get_output()


def _network(quant_type: torch.dtype = I8) -> Network:
    """An image of 3 channels -> a 5x5 stride-2 convolution (K walked flat) -> ReLU -> one of 40 channels quantized
    with a zero point (by tap, a channel tail) -> a dilated one -> plus its input."""
    net = Network("qconv")
    x = net.add_input("x", torch.float32, (2, 3, 13, 11))
    h = net.add_activation(_conv(net, x, 3, 40, 5, 2, 2, quant_type=quant_type), L.ActivationType.RELU).get_output()
    zero = -128 if quant_type == I8 else 0
    h2 = _conv(net, h, 40, 36, 3, 1, 1, zero=zero, scale=0.02, quant_type=quant_type)
    h3 = _conv(net, h2, 36, 36, 3, 1, 2, dilation=2, quant_type=quant_type)
    net.mark_output(net.add_elementwise(h3, h2, L.ElementWiseOperation.SUM).get_output())
    return net


def _plan(net: Network, monkeypatch, config: str | None, device: torch.device = CPU):
    monkeypatch.setattr(gemm_tactic, "choose", lambda network, requests, *args: [
        config if r.kind == GENERATED_CONV_OP else None for r in requests])
    return planner.make_plan(net, device, BackendOptions(timing_iterations=0))


def _steps(net: Network, plan) -> list[tuple[str, list[str]]]:
    return [(plan.kernels[s.kernel].op, [net.layers[j].KIND for j in s.layers]) for s in plan.steps]


def _assert_close(got: torch.Tensor, ref: torch.Tensor, quant_type: torch.dtype = I8) -> None:
    """int8: fp32 rounding (integer sums scaled once against the reference's float sums of dequantized values) on
    nearly every value; a value the next layer quantizes may sit on a rounding tie and come out one int8 step over,
    which moves a few outputs by up to about 1e-3 of max|ref|. fp8: the GPU's fp8 tensor cores add products in fewer
    bits than float32, so more values the next layer quantizes land one fp8 step (1/16 of their size) away: cosine
    0.9999 and 2% of max|ref| at most."""
    assert torch.isfinite(ref).all() and float(ref.float().std()) > 0.1 * float(ref.abs().max())  # not one value
    err, top = (got.float() - ref.float()).abs(), float(ref.abs().max())
    if quant_type == F8:
        cosine = torch.nn.functional.cosine_similarity(got.float().flatten(), ref.float().flatten(), dim=0)
        assert cosine >= 0.9999 and float(err.max()) <= 0.02 * top, (float(cosine), float(err.max()), top)
        return
    assert float(err.max()) <= 1e-3 * top
    assert float((err > 1e-5 * top).float().mean()) <= 1e-3


@on_the_cpu
@pytest.mark.parametrize("config", ["16,16,32,1,4,2", "32,64,64,2,4,4"], ids=["k32", "k64"])
def test_generated_quantized_convolution_matches_the_reference(config, monkeypatch):
    """int8 in Triton's interpreter: K walked flat (3 input channels) and by tap (40, then 36: tails of both K
    blocks), stride 2, padding, dilation, a zero point of -128 (padding loads it), the ReLU, the next layer's
    quantize and the residual in the epilogues. (fp8's conversion is the GPU's: it runs in the GPU test.)"""
    pytest.importorskip("triton", reason="triton is not installed")
    net = _network()
    plan = _plan(net, monkeypatch, config)
    assert _steps(net, plan) == [
        ("pointwise", ["quantize"]),
        (GENERATED_CONV_OP, ["dequantize", "convolution", "activation", "quantize"]),
        (GENERATED_CONV_OP, ["dequantize", "convolution"]),  # read by the residual add and the next quantize
        ("pointwise", ["quantize"]),
        (GENERATED_CONV_OP, ["dequantize", "convolution", "elementwise"])]
    x = torch.randn(2, 3, 13, 11, generator=torch.Generator().manual_seed(1)) * 3
    _assert_close(run_plan_eagerly(net, plan, [x])[0], ReferenceExecutor(net, CPU).run([x])[0])


@on_the_cpu
@pytest.mark.parametrize("k, stride, pad, dilation, zero", [
    (3, 2, 1, 1, -128), (3, 1, 3, 1, -128), (1, 2, 0, 1, -128), (5, 1, 2, 2, 5), (2, 3, 1, 1, 100),
    (1, 1, 0, 1, 100)], ids=["strided", "padding-past-the-window", "1x1-downsample", "dilated", "even-window",
                              "1x1-as-a-gemm"])
def test_zero_points_through_every_window_shape(k, stride, pad, dilation, zero, monkeypatch):
    """One quantized convolution (a float output, so nothing is requantized) of an input with a zero point: windows
    partly or wholly in the padding take the taps inside the image only (the rectangle table), at any stride,
    padding (wider than half the window too), dilation and window size; exact but for fp32 rounding."""
    pytest.importorskip("triton", reason="triton is not installed")
    net = Network("window")
    x = net.add_input("x", torch.float32, (2, 24, 7, 9))
    net.mark_output(_conv(net, x, 24, 20, k, stride, pad, dilation, zero=zero, scale=0.03))
    plan = _plan(net, monkeypatch, "16,16,32,1,4,2")
    assert [op for op, _ in _steps(net, plan)] == ["pointwise", GENERATED_CONV_OP]
    x = torch.randn(2, 24, 7, 9, generator=torch.Generator().manual_seed(k + pad)) * 2
    got = run_plan_eagerly(net, plan, [x])[0]
    ref = ReferenceExecutor(net, CPU).run([x])[0]
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def _pointwise_network(quant_type: torch.dtype = I8, channels: tuple[int, int] = (24, 40)) -> Network:
    """Two 1x1 stride-1 convolutions (c -> d -> c channels) of inputs with a zero point (int8), a ReLU and the next
    quantize after the first, the block's input added after the second; 63 positions an image."""
    net = Network("qgemm")
    c, d = channels
    x = net.add_input("x", torch.float32, (2, c, 7, 9))
    zero = -128 if quant_type == I8 else 0
    h = net.add_activation(_conv(net, x, c, d, 1, 1, 0, zero=zero, scale=0.03, quant_type=quant_type),
                           L.ActivationType.RELU).get_output()
    h2 = _conv(net, h, d, c, 1, 1, 0, zero=zero, scale=0.02, quant_type=quant_type)
    net.mark_output(net.add_elementwise(h2, x, L.ElementWiseOperation.SUM).get_output())
    return net


def _gemm_calls(monkeypatch) -> list[bool]:
    """Records each generated GEMM launch (a 1x1 convolution's kernel): whether it took tensor descriptors."""
    from torchkiln.runtime.backends.cuda.codegen.gemm import GemmLauncher

    calls, described = [], GemmLauncher._described

    def recorded(self, *args, **kwargs):
        found = described(self, *args, **kwargs)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(GemmLauncher, "_described", recorded)
    return calls


@on_the_cpu
@pytest.mark.parametrize("channels, described", [((24, 40), False), ((32, 48), True)],
                         ids=["rows-of-24-and-40-bytes-pointers", "rows-of-32-and-48-bytes-descriptors"])
def test_a_1x1_convolution_runs_as_a_quantized_gemm_over_its_channels(channels, described, monkeypatch):
    """A quantized 1x1 convolution of stride 1 is the generated quantized GEMM (no window arithmetic), its input's
    zero point subtracted through the weight's column sums, M and K not multiples of the blocks, with its epilogue:
    against the reference meanings. Rows of a multiple of 16 bytes are read and written through tensor descriptors
    (the residual and the outputs too), others through pointers; launches recorded for a tape take pointers."""
    pytest.importorskip("triton", reason="triton is not installed")
    from torchkiln.runtime.backends.cuda.codegen import captured_later

    net = _pointwise_network(channels=channels)
    plan = _plan(net, monkeypatch, "16,16,32,1,4,2")
    assert _steps(net, plan) == [
        ("pointwise", ["quantize"]),
        (GENERATED_CONV_OP, ["dequantize", "convolution", "activation", "quantize"]),
        (GENERATED_CONV_OP, ["dequantize", "convolution", "elementwise"])]
    calls = _gemm_calls(monkeypatch)
    x = torch.randn(2, channels[0], 7, 9, generator=torch.Generator().manual_seed(4)) * 2
    ref = ReferenceExecutor(net, CPU).run([x])[0]
    _assert_close(run_plan_eagerly(net, plan, [x])[0], ref)
    assert calls == [described, described]
    with captured_later():
        _assert_close(run_plan_eagerly(net, plan, [x])[0], ref)
    assert calls[2:] == [False, False]


@on_the_cpu
def test_without_timing_a_quantized_convolution_is_its_dequantize_and_the_library_convolution(monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed")
    net = _network()
    plan = _plan(net, monkeypatch, None)
    assert [op for op, _ in _steps(net, plan)].count("dequantized_conv") == 3
    x = torch.randn(2, 3, 13, 11, generator=torch.Generator().manual_seed(1)) * 3
    _assert_close(run_plan_eagerly(net, plan, [x])[0], ReferenceExecutor(net, CPU).run([x])[0])


def _per_channel(net: Network, x):
    q = net.add_layer(L.QuantizeLayer, [x], weights={"scale": torch.tensor([0.1])}, quant_type=I8).get_output()
    dq = net.add_layer(L.DequantizeLayer, [q], weights={"scale": torch.rand(8) + 0.1}, quant_type=I8, axis=1)
    conv = _conv(net, x, 8, 8, 3, 1, 1).producer
    conv.inputs[0] = dq.get_output()
    return conv.outputs[0]


def _single(build) -> Network:
    net = Network("one")
    x = net.add_input("x", torch.float32, (1, 8, 6, 6))
    net.mark_output(build(net, x))
    return net


def _read_twice(net: Network, x):
    conv = _conv(net, x, 8, 8, 3, 1, 1)
    dq = conv.producer.inputs[0]
    return net.add_elementwise(conv, net.add_activation(dq, L.ActivationType.RELU).get_output(),
                               L.ElementWiseOperation.SUM).get_output()


@pytest.mark.parametrize("build", [
    lambda net, x: _conv(net, x, 8, 8, 3, 1, 1, groups=2),
    _read_twice,
    _per_channel,
], ids=["grouped", "dequantized-value-read-twice", "dequantized-per-channel"])
def test_the_planner_leaves_convolutions_the_kernel_does_not_take(build, monkeypatch):
    net = _single(build)
    plan = _plan(net, monkeypatch, "16,16,32,1,4,2")
    ops = [op for op, _ in _steps(net, plan)]
    assert "dequantized_conv" not in ops and GENERATED_CONV_OP not in ops


@on_the_cpu
def test_zero_point_quantizers_and_dequantizers_are_generated_where_they_are_read(monkeypatch):
    """relu(conv(dq(q(x))) + dq(q(x))) quantized to [0, amax] (zero point -128), q(x) of zero point 3: q(x) is one
    kernel writing int8 only, and the residual's dequantize runs in the kernel of the add that alone reads it (in
    q(x)'s kernel, that kernel would write its float32 value besides). Bit for bit the reference's: ties, clamping,
    NaN (the convolution's library step is exact for this input)."""
    pytest.importorskip("triton", reason="triton is not installed")
    net = Network("qadd")
    x = net.add_input("x", torch.float32, (1, 8, 5, 5))
    conv = _conv(net, x, 8, 8, 1, 1, 0, zero=3, scale=0.5)
    q = conv.producer.inputs[0].producer.inputs[0]
    residual = net.add_layer(L.DequantizeLayer, [q], weights=dict(q.producer.weights), quant_type=I8).get_output()
    relu = net.add_activation(net.add_elementwise(conv, residual, L.ElementWiseOperation.SUM).get_output(),
                              L.ActivationType.RELU).get_output()
    net.mark_output(net.add_layer(L.QuantizeLayer, [relu], weights={"scale": torch.tensor([0.125]),
                                                                     "zero_point": torch.tensor([-128], dtype=I8)},
                                  quant_type=I8, divide=True).get_output())
    plan = _plan(net, monkeypatch, None)
    assert _steps(net, plan) == [("pointwise", ["quantize"]), ("dequantized_conv", ["dequantize", "convolution"]),
                                 ("pointwise", ["dequantize", "elementwise", "activation", "quantize"])]
    x = torch.randn(1, 8, 5, 5, generator=torch.Generator().manual_seed(2)) * 30
    x[0, 0, 0, :5] = torch.tensor([0.25, 0.75, -1.25, float("nan"), float("inf")])
    got = run_plan_eagerly(net, plan, [x])[0]
    ref = ReferenceExecutor(net, CPU).run([x])[0]
    assert got.dtype == I8 and torch.equal(got, ref)
    assert int(ref.min()) == -128 and int(ref.max()) == 127


class SmallResNet(torch.nn.Module):
    """A stem, a max pooling, a residual block and a strided one with a 1x1 downsample; their feature map."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn

        def block(cin: int, cout: int, stride: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout))

        self.stem = nn.Sequential(nn.Conv2d(3, 16, 5, 2, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.one, self.two = block(16, 16, 1), block(16, 32, 2)
        self.down = nn.Sequential(nn.Conv2d(16, 32, 1, 2), nn.BatchNorm2d(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(self.one(x) + x)
        return torch.relu(self.two(x) + self.down(x))


def _calibrated(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    """Batch-norm statistics from data, so the random network's activations are not all one value."""
    model.train()
    with torch.no_grad():
        model(x)
    return model.eval()


@on_the_cpu
def test_int8_cnn_plan_runs_its_convolutions_generated_and_matches_the_reference_engine(monkeypatch):
    """Post-training int8 quantization of a residual CNN, its CUDA plan made on the CPU: every convolution is a
    generated quantized one (stem, 3x3, strided, 1x1 downsample), each with its epilogue, against the reference
    engine of the same network."""
    pytest.importorskip("triton", reason="triton is not installed")
    from torchkiln.runtime import integer_kernels

    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: True)  # 8-bit weights, as a GPU build's
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    model = _calibrated(SmallResNet(), torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(6)))
    network = Engine.deserialize(torchkiln.convert_method_to_engine(
        model, "forward", [x], backend="reference", enabled_precisions={I8}, calibration_inputs=[x])).network
    plan = _plan(network, monkeypatch, "32,32,32,1,4,2")
    check_steps(network, plan.steps)  # every layer computed once, after what it reads
    convs = [layers for op, layers in _steps(network, plan) if "convolution" in layers]
    assert len(convs) == 6 and all(op == GENERATED_CONV_OP for op, layers in _steps(network, plan)
                                   if "convolution" in layers)
    got = run_plan_eagerly(network, plan, [x])[0]
    _assert_close(got, ReferenceExecutor(network, CPU).run([x])[0])


@needs_cuda
@pytest.mark.parametrize("quant_type", [I8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize("config", ["64,64,32,3,4", "128,128,64,4,4"])
def test_generated_quantized_convolution_on_the_gpu(quant_type, config, monkeypatch):
    """The CUDA runner (eager, captured, replayed) with generated quantized convolutions, against the meanings."""
    if quant_type == F8 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89")
    from torchkiln.runtime.backends.cuda.runner import CudaRunner

    net = _network(quant_type)
    device = torch.device("cuda")
    plan = _plan(net, monkeypatch, config, device)
    assert [op for op, _ in _steps(net, plan)].count(GENERATED_CONV_OP) == 3
    runner = CudaRunner(net, plan, device, BackendOptions())
    x = torch.randn(2, 3, 13, 11, generator=torch.Generator().manual_seed(1)) * 3
    ref = ReferenceExecutor(net, CPU).run([x])[0]
    for _ in range(3):
        got = runner.run([x.to(device)])[0].cpu()
    _assert_close(got, ref, quant_type)


@needs_cuda
@pytest.mark.parametrize("quant_type", [I8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize("config", ["16,16,32,1,4,2", "128,64,64,2,4", "64,128,64,3,4"])
@pytest.mark.parametrize("channels", [(24, 40), (32, 48)], ids=["pointers", "descriptors"])
def test_a_1x1_convolution_as_a_quantized_gemm_on_the_gpu(quant_type, config, channels, monkeypatch):
    """The CUDA runner (eager, captured, replayed); float32 outputs [*, 128] wide tiles where the config has them."""
    if quant_type == F8 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89")
    from torchkiln.runtime.backends.cuda.runner import CudaRunner

    net = _pointwise_network(quant_type, channels)
    device = torch.device("cuda")
    plan = _plan(net, monkeypatch, config, device)
    calls = _gemm_calls(monkeypatch)
    runner = CudaRunner(net, plan, device, BackendOptions())
    x = torch.randn(2, channels[0], 7, 9, generator=torch.Generator().manual_seed(4)) * 2
    ref = ReferenceExecutor(net, CPU).run([x])[0]
    for _ in range(3):
        got = runner.run([x.to(device)])[0].cpu()
    _assert_close(got, ref, quant_type)
    assert calls and all(c == (channels == (32, 48)) for c in calls)


@needs_cuda
@pytest.mark.parametrize("quant_type", [I8, F8], ids=["int8", "fp8"])
def test_quantized_cnn_engine_on_the_gpu(quant_type):
    """A post-training quantized residual CNN compiled for the cuda backend, its convolutions timed against the
    library: the engine's output against eager fp32 (cosine), and against the reference backend's engine of the same
    quantization."""
    if quant_type == F8 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89")
    device = torch.device("cuda")
    model = _calibrated(SmallResNet(), torch.randn(16, 3, 32, 32)).to(device)
    x = torch.randn(8, 3, 32, 32, device=device)
    compiled = torchkiln.compile(model, [x], backend="cuda", enabled_precisions={quant_type},
                                 calibration_inputs=[x])
    with torch.no_grad():
        out, ref = compiled(x).float(), model(x)
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cosine >= 0.99, cosine


def _pool_network(same: bool) -> Network:
    """x -> quantize (zero point -128) -> dequantize -> 3x3 stride-2 max pool (padding 1) -> quantize of the same
    scale and zero point (or another scale) -> dequantize."""
    net = Network("qpool")
    x = net.add_input("x", torch.float32, (2, 24, 9, 9))
    pool = net.add_pooling_nd(_fake_quantize(net, x, 0.05, -128, I8), L.PoolingType.MAX, (3, 3), stride=(2, 2),
                              padding=(1, 1))
    net.mark_output(_fake_quantize(net, pool.get_output(), 0.05 if same else 0.07, -128, I8))
    return net


@on_the_cpu
def test_a_max_pool_between_quantizers_of_one_scale_pools_the_int8_values():
    """The dequantize, the pool and the quantize are one generated max pool of the int8 values (a quarter of the
    bytes), exactly the reference's; with another scale after the pool, the pool reads and writes float."""
    pytest.importorskip("triton", reason="triton is not installed")
    for same in (True, False):
        net = _pool_network(same)
        plan = planner.make_plan(net, CPU, BackendOptions(timing_iterations=0))
        pools = [layers for op, layers in _steps(net, plan) if op == "max_pool"]
        assert pools == ([["dequantize", "pooling", "quantize"]] if same else [["pooling"]])
        x = torch.randn(2, 24, 9, 9, generator=torch.Generator().manual_seed(3)) * 4
        assert torch.equal(run_plan_eagerly(net, plan, [x])[0], ReferenceExecutor(net, CPU).run([x])[0])


@needs_cuda
def test_a_max_pool_of_int8_values_on_the_gpu():
    from torchkiln.runtime.backends.cuda.runner import CudaRunner

    net = _pool_network(True)
    device = torch.device("cuda")
    plan = planner.make_plan(net, device, BackendOptions(timing_iterations=0))
    assert [layers for op, layers in _steps(net, plan) if op == "max_pool"] == [["dequantize", "pooling", "quantize"]]
    x = torch.randn(2, 24, 9, 9, generator=torch.Generator().manual_seed(3)) * 4
    got = CudaRunner(net, plan, device, BackendOptions()).run([x.to(device)])[0].cpu()
    assert torch.equal(got, ReferenceExecutor(net, CPU).run([x])[0])


def test_tile_candidates_fit_the_convolution():
    """The tiles timed for a quantized convolution: K blocks no deeper than its input channels (but 32), up to 128
    for wide ones; two pipeline stages where K is one block (a 1x1 convolution of few channels), more where it
    loops; no two of the same blocks."""
    from torchkiln.runtime.backends.cuda.codegen.quantized_conv import candidates

    one_block = candidates(32 * 56 * 56, 256, 64, 64, 132)  # 1x1, 64 -> 256 channels
    assert one_block and all(c.block_k == 64 and c.stages == 2 for c in one_block)
    deep = candidates(32 * 7 * 7, 512, 9 * 512, 512, 132)  # 3x3, 512 channels
    assert max(c.block_k for c in deep) == 128 and all(c.stages > 2 for c in deep)
    assert all(c.block_k == 32 for c in candidates(32 * 28 * 28, 64, 9 * 24, 24, 132))  # 24 channels: one 32 block
    pointwise = candidates(32 * 56 * 56, 256, 64, 64, 132, pointwise=True)  # a GEMM over 64 channels
    assert (128, 64, 64, 2) in [(c.block_m, c.block_n, c.block_k, c.stages) for c in pointwise]
    wide = candidates(32 * 14 * 14, 256, 1024, 1024, 132, pointwise=True)
    assert all(c.block_k == 128 and c.stages > 2 for c in wide)
    for found in (one_block, deep, candidates(49, 512, 9 * 512, 512, 132), pointwise, wide):
        blocks = [(c.block_m, c.block_n, c.block_k) for c in found]
        assert len(blocks) == len(set(blocks))
        assert all(c.block_m * c.block_n <= 128 * 128 for c in found)
