"""Post-training quantization (int8 and fp8) through compile: trained models keep their accuracy, the calibration
cache is reused, a layer that quantizes badly stays in float (named with its error), Torch-TensorRT's ptq
calibrators work, QAT graphs keep their own scales, and ONNX Runtime runs quantized engines on integer kernels."""
from __future__ import annotations

import json
import logging
import math

import onnx
import onnxruntime as ort
import pytest
import torch
from harness import assert_matches_eager, session_graph

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.onnx_export import network_to_onnx
from torchkiln.runtime.backends.onnxruntime import DISABLED_OPTIMIZERS, session_onnx
from torchkiln.runtime.engine import Engine
from torchkiln.stitching.stitch import engine_attrs

I8, F8 = torch.int8, torch.float8_e4m3fn
MARGIN = 0.005  # quantized top-1 within half a point of fp32's (the issue's target)
CLASSES, TRAIN, TEST = 10, 2000, 2000



def _digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable 8x8 image set made here (nothing downloaded): ten fixed random templates under heavy noise, so
    that a small model reaches about 90% top-1, not 100% (a drop can show)."""
    templates = torch.randn(CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    return templates[y] + 2.5 * torch.randn(n, 1, 8, 8, generator=gen), y


class Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(32 * 16, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Transformer(torch.nn.Module):
    """One pre-norm encoder block over the image's 8 rows as tokens; the head reads every token."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.position = torch.nn.Parameter(torch.randn(8, width) * 0.1)
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.ff1, self.ff2 = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)
        self.head = torch.nn.Linear(8 * width, CLASSES)
        self.scale = 1 / math.sqrt(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(-1, 8, 8)) + self.position
        q, k, v = self.qkv(self.norm1(h)).chunk(3, -1)
        h = h + self.proj(torch.softmax(q @ k.transpose(1, 2) * self.scale, -1) @ v)
        h = h + self.ff2(torch.relu(self.ff1(self.norm2(h))))
        return self.head(h.flatten(1))


def _train(model: torch.nn.Module, steps: int = 60) -> torch.nn.Module:
    """A few Adam steps, on one thread (tiny kernels: a second thread only adds synchronization, 0.2 s against
    3 s for the CNN on a busy machine, and one thread sums in one order on every machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _steps(model, steps)
    finally:
        torch.set_num_threads(threads)


def _steps(model: torch.nn.Module, steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    x, y = _digits(TRAIN, 0)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    for step in range(steps):
        batch = slice(step * 100 % TRAIN, step * 100 % TRAIN + 100)
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def _seeded(build: type[torch.nn.Module]) -> torch.nn.Module:
    """The model with the same initial weights whichever tests ran before in this process."""
    torch.manual_seed(1)
    return build()


@pytest.fixture(scope="module")
def trained():
    return {"cnn": _train(_seeded(Cnn)), "transformer": _train(_seeded(Transformer))}


@pytest.fixture(scope="module")
def quantized(trained):
    """Each trained model compiled once per type (onnxruntime on the CPU, the default), with its report."""
    found = {}

    def get(name: str, quant_type: torch.dtype):
        if (name, quant_type) not in found:
            found[name, quant_type] = compile_with_report(trained[name], [torchkiln.Input((BATCH, 1, 8, 8))],
                                                          enabled_precisions={quant_type},
                                                          calibration_inputs=_samples())
        return found[name, quant_type]
    return get


def _top1(model, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((torch.cat([model(x[i:i + BATCH]) for i in range(0, len(x), BATCH)]).argmax(1) == y).float().mean())


BATCH = 500


def _samples(n: int = 2) -> list[torch.Tensor]:
    x, _ = _digits(n * BATCH, 7)
    return list(x.split(BATCH))


def _network(module) -> list[L.Layer]:
    data = getattr(module, engine_attrs(module)[0])
    return Engine.deserialize(data.numpy().tobytes()).network.layers


@pytest.mark.parametrize("quant_type", [I8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_trained_model_keeps_its_top1(trained, quantized, name, quant_type):
    model = trained[name]
    x, y = _digits(TEST, 1)
    fp32 = _top1(model, x, y)
    assert fp32 > 0.8, f"{name} trained to only {fp32:.3f}"
    compiled, report = quantized(name, quant_type)
    quantized = [layer for layer in _network(compiled) if isinstance(layer, L.DequantizeLayer)]
    assert quantized and not report.fp32_layers, report.fp32_layers
    top1 = _top1(compiled, x, y)
    assert top1 >= fp32 - MARGIN, f"{name} {quant_type}: top-1 {top1:.4f}, fp32 {fp32:.4f}"


def test_calibration_cache_makes_a_rebuild_skip_calibration(trained, tmp_path, caplog):
    """Torch-TensorRT's ptq calibrators: a DataLoaderCalibrator over (inputs, labels) batches calibrates and writes
    the cache; a CacheCalibrator has no data (it would raise if calibration ran), so the second compile reads the
    ranges from the cache, and both engines compute the same."""
    cache = tmp_path / "calibration.json"
    x, y = _digits(2 * BATCH, 7)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    spec = [torchkiln.Input((BATCH, 1, 8, 8))]
    calibrator = torchkiln.ptq.DataLoaderCalibrator(loader, algo_type=torchkiln.ptq.CalibrationAlgo.MINMAX_CALIBRATION,
                                                    cache_file=str(cache))
    first = torchkiln.compile(trained["cnn"], spec, enabled_precisions={I8}, calibrator=calibrator)
    assert cache.exists()
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        again = torchkiln.compile(trained["cnn"], spec, enabled_precisions={I8},
                                  calibrator=torchkiln.ptq.CacheCalibrator(str(cache), "max"))
    assert "calibration ranges read from" in caplog.text
    assert torch.equal(first(x[:BATCH]), again(x[:BATCH]))
    with pytest.raises(ValueError, match="has no entry for this engine"):  # another algorithm: no usable entry
        torchkiln.compile(trained["cnn"], spec, enabled_precisions={I8},
                          calibrator=torchkiln.ptq.CacheCalibrator(str(cache), "entropy"))


class DeepConvs(torch.nn.Module):
    """Eight 3x3 convolutions with ReLUs, widths 16: each layer's fp8 error within its tolerance, compounded."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(1 if i == 0 else 16, 16, 3, padding=1) for i in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x))
        return x


@pytest.mark.parametrize("floor,warned", [(0.0, False), (1.01, True)], ids=["above", "under"])
def test_quantized_network_cosine_on_the_calibration_samples_is_measured_and_warned(monkeypatch, caplog, floor,
                                                                                    warned):
    """The build measures the quantized network's outputs against float32 on the calibration samples (each layer
    within its own tolerance, their errors add up): the logged cosine is the engine's own against eager's on those
    samples, a warning where it is under `NETWORK_COSINE` (naming the algorithm), an info line otherwise."""
    from torchkiln.builder import quantization

    monkeypatch.setattr(quantization, "NETWORK_COSINE", floor)
    model, samples = _seeded(DeepConvs).eval(), [torch.randn(4, 1, 12, 12) for _ in range(2)]
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        compiled = torchkiln.compile(model, [torchkiln.Input((4, 1, 12, 12))], enabled_precisions={F8},
                                     calibration_inputs=samples, backend="reference")
    record = next(r for r in caplog.records if "outputs' cosine against float32" in r.getMessage())
    assert (record.levelno == logging.WARNING) == warned
    assert ("calibration_algorithm (max now)" in record.getMessage()) == warned
    with torch.no_grad():
        cosine = min(float(torch.nn.functional.cosine_similarity(compiled(x).flatten(), model(x).flatten(), dim=0))
                     for x in samples)
    assert f"is {cosine:.4f}" in record.getMessage(), (cosine, record.getMessage())
    assert cosine < 0.9999  # fp8 changed the values: a cosine that can tell


class Offset(torch.nn.Module):
    """A convolution that takes differences of a signal riding on a large offset: per-tensor quantization of its
    input loses the differences (its step is the offset / 127), so it must stay in float; the next one is fine."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.diff = torch.nn.Conv2d(1, 8, 3)  # no padding: every window sees the offset
        self.next = torch.nn.Conv2d(8, 8, 3, padding=1)
        with torch.no_grad():
            kernel = torch.randn(8, 1, 3, 3, generator=gen)
            self.diff.weight.copy_(kernel - kernel.mean((1, 2, 3), keepdim=True))  # sums to 0: the offset cancels
            self.next.weight.copy_(torch.randn(8, 8, 3, 3, generator=gen) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.next(torch.relu(self.diff(x + 1000.0)))


def test_layer_that_quantizes_badly_stays_in_float_and_is_named(caplog):
    model = Offset().eval()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled, report = compile_with_report(model, [x], enabled_precisions={I8}, calibration_inputs=[x])
    assert [r.kind for r in report.fp32_layers] == ["convolution"], report.fp32_layers
    kept = report.fp32_layers[0]
    assert "quantized output error" in kept.reason and "past the tolerance" in kept.reason
    assert kept.layer in caplog.text and "stays in float" in caplog.text
    assert "kept in float" in str(report)
    layers = _network(compiled)
    convolutions = [layer for layer in layers if isinstance(layer, L.ConvolutionLayer)]
    assert [c.kernel_type for c in convolutions] == [None, I8]
    with torch.no_grad():
        out, ref = compiled(x), model(x)
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cosine > 0.999, cosine


class Overflowing(torch.nn.Module):
    """Two linear layers around a square that leaves float16's range (90,000 and more)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        big = (h * 300.0) * (h * 300.0)
        return self.b(torch.log1p(big.sum(-1, keepdim=True) * 1e-6) * h)


def test_float16_layers_of_a_quantized_engine_keep_precision_safety(monkeypatch, caplog):
    """float16 with int8: the engine's float layers are checked on the samples as a float16 build's are, so the
    square that overflows float16 stays in float32 (it gave inf, and outputs 3x their scale off). The quantized
    engine is kept whatever the timing says (which of the two builds runs faster is not this test's subject)."""
    import torchkiln.compiler as compiler

    monkeypatch.setattr(compiler, "_keep_faster", lambda engine, own, convert, build, samples, safety, kept, labels:
                        kept.extend(own) or engine)
    torch.manual_seed(0)
    model = Overflowing().eval()
    x = torch.randn(16, 64)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled, report = compile_with_report(model, [x], enabled_precisions={torch.half, I8}, backend="reference",
                                               calibration_inputs=[(torch.randn(16, 64),) for _ in range(2)])
    assert sum(isinstance(layer, L.DequantizeLayer) for layer in _network(compiled)) >= 2  # the quantized engine
    overflowing = [r for r in report.fp32_layers if "overflows" in r.reason]
    assert [r.kind for r in overflowing] == ["elementwise"], report.fp32_layers
    assert overflowing[0].layer in caplog.text
    with torch.no_grad():
        out, ref = compiled(x).float(), model(x)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() <= 0.05 * ref.abs().max().item()


def test_layers_a_backend_has_no_quantized_kernel_for_stay_in_float():
    """The cuda backend quantizes 2-D convolutions of one group and at least 16 input channels, and matrix
    multiplies: a grouped convolution and an image stem stay in float with that reason (a convolution of dequantized
    values would run slower than in float); ONNX Runtime quantizes every one."""
    from torchkiln.builder.quantization import QuantizedLayer, without_kernels

    net = Network("kinds")
    x = net.add_input("x", torch.float32, (1, 16, 8, 8))
    for name, groups, source in (("c", 1, x), ("g", 2, x), ("stem", 1, net.add_input("image", torch.float32,
                                                                                       (1, 3, 8, 8)))):
        conv = net.add_convolution_nd(source, torch.randn(16, source.shape[1] // groups, 3, 3), None, stride=(1, 1),
                                      padding=(1, 1), dilation=(1, 1), groups=groups)
        conv.name = name
    mm = net.add_matrix_multiply(x, L.MatrixOperation.NONE, net.add_constant(torch.randn(8, 8)).get_output(),
                                 L.MatrixOperation.NONE)
    mm.name = "m"
    bad = net.add_matrix_multiply(x, L.MatrixOperation.NONE, net.add_constant(torch.randn(8, 8)).get_output(),
                                  L.MatrixOperation.NONE)
    bad.name = "bad"
    layers = [QuantizedLayer(name, "convolution", 1.0, 0.01) for name in ("c", "g", "stem")] + \
        [QuantizedLayer("m", "matrix_multiply", 1.0, 0.01),
         QuantizedLayer("bad", "matrix_multiply", 1.0, 0.5, kept="quantized output error 0.5")]
    cuda = without_kernels(layers, "cuda", net)
    why = "the cuda backend has no quantized convolution kernel of its form: "
    assert [q.kept for q in cuda] == [
        "", why + "only a convolution of one group",
        why + "3 input channels (a kernel of fewer than 16 is slower than the half-precision library's)", "",
        "quantized output error 0.5"]
    assert without_kernels(layers, "onnxruntime", net) == layers


def test_without_precision_checks_the_same_layer_would_lose_its_signal():
    """The check above can fail: quantized, the offset convolution's output is mostly error."""
    from torchkiln.builder.quantization import relative_rms
    from torchkiln.builder.ranges import fake_quantized

    model = Offset().eval()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(4)) + 1000.0
    with torch.no_grad():
        ref = model.diff(x)
        low = model.diff(fake_quantized(x, float(x.abs().max()), I8))
    assert relative_rms(ref, low) > 0.5


class Qat(torch.nn.Module):
    """A quantization-aware model as torch.ao leaves it: fake quantization of the input (int8), the weights (per
    channel, symmetric -127..127) and the output after ReLU (uint8's 0..255)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.weight = torch.nn.Parameter(torch.randn(8, 3, 3, 3, generator=gen) * 0.3)
        self.bias = torch.nn.Parameter(torch.randn(8, generator=gen))
        self.register_buffer("weight_scale", self.weight.detach().abs().amax((1, 2, 3)) / 127)
        self.register_buffer("weight_zero", torch.zeros(8, dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127)
        w = torch.fake_quantize_per_channel_affine(self.weight, self.weight_scale, self.weight_zero, 0, -127, 127)
        y = torch.relu(torch.nn.functional.conv2d(x, w, self.bias, padding=1))
        return torch.fake_quantize_per_tensor_affine(y, 0.1, 0, 0, 255)


@pytest.mark.parametrize("precisions", [{torch.float32}, {I8}], ids=["fp32", "int8"])
def test_qat_graph_keeps_its_own_scales_and_matches_eager(precisions):
    """Its fake quantization becomes Q/DQ layers with the graph's scales (uint8's range moved into int8's), the
    convolution's kernel is marked int8, and calibration (int8) adds no quantizer of its own: eager's values
    exactly on the reference backend; on ONNX Runtime, whose QLinearConv (the ReLU dropped before a quantizer of
    range [0, amax]) rescales its integer sums and divides by the output scale, a value a last bit from a half step
    may land one step away (docs/quantization.md)."""
    model = Qat().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6)) * 3
    options = dict(enabled_precisions=precisions, calibration_inputs=[x], min_block_size=1)
    compiled = torchkiln.compile(model, [x], **options)
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    with torch.no_grad():
        ref = model(x)
        assert_matches_eager(reference(x), ref, rtol=0)
        out = compiled(x)
    assert float((out - ref).abs().max()) <= 0.1 * (1 + 1e-6) and float((out != ref).float().mean()) < 0.01
    layers = _network(compiled)
    quantizers = [(float(q.weights["scale"]), int(q.weights["zero_point"]), q.quant_min, q.quant_max)
                  for q in layers if isinstance(q, L.QuantizeLayer)]
    f32 = lambda v: torch.tensor(v).item()  # noqa: E731  (the float32 the graph holds)
    assert quantizers == [(f32(0.05), 3, -128, 127), (f32(0.1), -128, -128, 127)], quantizers
    conv = next(layer for layer in layers if isinstance(layer, L.ConvolutionLayer))
    assert conv.kernel_type == I8 and torch.equal(conv.weights["kernel_scale"], model.weight_scale)


def _executed_ops(network, tmp_path, x: torch.Tensor | None = None) -> list[str]:
    """The op types ONNX Runtime runs for the network's export (as the backend exports it), from its profile (its
    optimized model cannot always be saved: ORT 1.32 fails to re-check a node its MatMul+Add fusion made)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(session_onnx(network).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_OPTIMIZERS)
    session.run(None, {session.get_inputs()[0].name: (_samples(1)[0] if x is None else x).numpy()})
    with open(session.end_profiling(), encoding="utf-8") as f:
        events = json.load(f)
    return [e["args"]["op_name"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_onnx_runtime_runs_quantized_layers_on_integer_kernels(quantized, name, tmp_path):
    """The export's QuantizeLinear/DequantizeLinear around convolutions and matrix multiplies are the QDQ form ORT
    fuses: QLinearConv, and MatMulIntegerToFloat for a matrix multiply whose output stays float (attention's
    products of two activations stay float); the CNN's flatten between them runs on uint8 (only the input and the
    second linear layer's input are quantized in the session)."""
    compiled, _ = quantized(name, I8)
    engine = Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes())
    assert not engine.reference_layers()  # one ONNX Runtime session for the whole engine
    ops = _executed_ops(engine.network, tmp_path)
    quantized = [m for m in engine.network.layers
                 if isinstance(m, L.MatrixMultiplyLayer) and isinstance(m.inputs[1].producer, L.DequantizeLayer)]
    assert quantized and ops.count("MatMulIntegerToFloat") == len(quantized) and "Gemm" not in ops, ops
    if name == "cnn":  # the flatten reads the second convolution's ReLU quantized and keeps its scale
        assert ops.count("QLinearConv") == 2 and "Conv" not in ops and "FusedConv" not in ops, ops
        assert ops.count("QuantizeLinear") == 2 and "DequantizeLinear" not in ops, ops


def test_quantized_linear_layers_add_their_bias_in_the_integer_kernel(quantized, tmp_path):
    """Each int8 linear layer runs as one MatMulIntegerToFloat that adds its bias: ORT runs no Add but the network's
    sums (24 bias Adds were 6% of the BERT-style encoder's int8 time at batch 8)."""
    compiled, _ = quantized("transformer", I8)
    nodes = session_graph(compiled, _samples(1), str(tmp_path))
    integer = [node for node in nodes if node.op_type == "MatMulIntegerToFloat"]
    layers = [m for m in _network(compiled) if isinstance(m, L.MatrixMultiplyLayer)
              and isinstance(m.inputs[1].producer, L.DequantizeLayer) and "bias" in m.weights]
    assert layers and len(integer) == len(layers) and all(len(n.input) == 7 and n.input[6] for n in integer), \
        [list(n.input) for n in integer]
    sums = [m for m in _network(compiled) if isinstance(m, L.ElementWiseLayer) and m.op == L.ElementWiseOperation.SUM]
    assert [node.op_type for node in nodes].count("Add") == len(sums), [node.op_type for node in nodes]


def test_calibrated_quantizers_divide_by_their_scale_in_quantize_linear(quantized, tmp_path):
    """The quantizers calibration places divide by their scale (`divide`), as ONNX's QuantizeLinear does, so the
    session quantizes each activation in one QuantizeLinear of its scale, exactly (test_onnx_export's
    quantize-divide cases), where a multiply by the reciprocal before a QuantizeLinear of scale 1 was 16 of the
    BERT-style encoder's int8 nodes (5% of its time)."""
    compiled, _ = quantized("transformer", I8)
    quantizers = [q for q in _network(compiled) if isinstance(q, L.QuantizeLayer)]
    assert quantizers and all(q.divide for q in quantizers)
    nodes = session_graph(compiled, _samples(1), str(tmp_path))
    made_by = {out: node for node in nodes for out in node.output}
    quantize = [node for node in nodes if node.op_type == "QuantizeLinear"]
    assert quantize and not [n.input[0] for n in quantize if getattr(made_by.get(n.input[0]), "op_type", "") == "Mul"]


class PoolAddLinear(torch.nn.Module):
    """Quantized convolutions with an average pooling and a sum (no ReLU after it) between them, which calibration
    leaves in float, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 8, 3, padding=1),
                                  torch.nn.Conv2d(16, 8, 1))
        self.out = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.avg_pool2d(self.a(x), 2)
        return self.out(torch.flatten(self.b(h) + self.c(h), 1))


def test_float_layers_between_dividing_quantizers_stay_float_on_onnx_runtime(tmp_path):
    """A dividing quantizer after a layer that reads dequantized values keeps a Div before its QuantizeLinear of
    scale 1: with the scale in QuantizeLinear, ORT fused DequantizeLinear -> AveragePool / Add -> QuantizeLinear into
    QLinearAveragePool and QLinearAdd, integer kernels that requantize, for layers the engine computes in float."""
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(0)
    model = PoolAddLinear().eval()
    compiled = torchkiln.compile(model, [x], enabled_precisions={I8}, calibration_inputs=[x])
    ops = _executed_ops(Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network,
                        tmp_path, x)
    assert ops.count("QLinearConv") == 3 and {"AveragePool", "Add"} <= set(ops), ops
    assert not {op for op in ops if op.startswith("QLinear") and op != "QLinearConv"}, ops


class MatmulByParameter(torch.nn.Module):
    """x @ w + b with w [in, out] (a matrix multiply reading its weight untransposed), then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.randn(16, 24) / 4), torch.nn.Parameter(torch.randn(24))
        self.out = torch.nn.Linear(24, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(x @ self.w + self.b))


def test_integer_matrix_multiplies_compute_the_reference_engines_values(tmp_path):
    """MatMulIntegerToFloat with the bias, for a weight read as it is ([in, out]: scales per column) and transposed
    (a linear layer's [out, in]): the reference engine's values within float32 rounding, and the standalone export
    standard ONNX (no com.microsoft op)."""
    torch.manual_seed(5)
    model, x = MatmulByParameter().eval(), torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(6))
    options = dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], **options)
    nodes = session_graph(compiled, [x], str(tmp_path))
    assert [len(n.input) for n in nodes if n.op_type == "MatMulIntegerToFloat"] == [7, 7], \
        [n.op_type for n in nodes]
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    assert_matches_eager(compiled(x), reference(x))
    export = network_to_onnx(Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network)
    assert {n.domain for n in export.graph.node} == {""} and "MatMul" in {n.op_type for n in export.graph.node}


def test_dynamic_batch_int8_engine_runs_on_onnx_runtime(trained, caplog):
    """An int8 engine of a dynamic batch runs on ONNX Runtime (its int8 activations, written as uint8, are declared
    uint8 in the export's shapes of symbolic dims): the reference engine's values at the calibration batch, and
    within a few values a quantization step away at others (the integer kernels round otherwise than float32 at a
    last bit from a half step: Backends in docs/quantization.md)."""
    x, _ = _digits(64, 1)
    spec = torchkiln.Input(min_shape=(1, 1, 8, 8), opt_shape=(16, 1, 8, 8), max_shape=(64, 1, 8, 8))
    options = dict(enabled_precisions={I8}, calibration_inputs=[x[:16]])
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled = torchkiln.compile(trained["transformer"], [spec], **options)
        out = {n: compiled(x[:n]) for n in (1, 16, 64)}
    assert "cannot run here" not in caplog.text, caplog.text
    reference = torchkiln.compile(trained["transformer"], [spec], backend="reference", **options)
    assert_matches_eager(out[16], reference(x[:16]))
    for n in (1, 64):
        cosine = torch.nn.functional.cosine_similarity(out[n].flatten(), reference(x[:n]).flatten(), dim=0)
        assert cosine > 0.99999 and torch.equal(out[n].argmax(1), reference(x[:n]).argmax(1)), (n, float(cosine))


def test_damaged_calibration_cache_is_recalibrated_with_a_warning(tmp_path, caplog):
    model = Offset().eval()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    cache = tmp_path / "calibration.json"
    first = torchkiln.compile(model, [x], enabled_precisions={I8}, calibration_inputs=[x],
                              calibration_cache_file=str(cache))
    data = json.loads(cache.read_text())
    for entry in data["engines"].values():
        entry["layers"][0]["amax"] = "large"
    cache.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        again = torchkiln.compile(model, [x], enabled_precisions={I8}, calibration_inputs=[x],
                                  calibration_cache_file=str(cache))
    assert "has no usable entry" in caplog.text
    assert torch.equal(first(x), again(x))


class TwoBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(3, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


def test_readers_of_one_activation_share_its_quantizer_each_with_its_own_dequantizer():
    """ONNX Runtime fuses a DequantizeLinear into QLinearConv (and the CUDA planner into a quantized step) only where
    the layer alone reads it."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(8))
    compiled = torchkiln.compile(TwoBranches().eval(), [x], enabled_precisions={I8}, calibration_inputs=[x])
    layers = _network(compiled)
    quantizers = [q for q in layers if isinstance(q, L.QuantizeLayer) and q.inputs[0].producer is None]
    assert len(quantizers) == 1
    readers = [layer for layer in layers if quantizers[0].outputs[0] in layer.inputs]
    assert len(readers) == 2 and all(isinstance(r, L.DequantizeLayer) for r in readers)
    for dq in readers:
        assert [type(layer) for layer in layers if dq.outputs[0] in layer.inputs] == [L.ConvolutionLayer]


def test_onnx_runtime_runs_convolutions_sharing_a_quantized_input_on_integer_kernels(tmp_path):
    """One activation quantized for two convolutions is exported as uint8 (ORT's own int8-to-uint8 rewrite skips a
    QuantizeLinear with several readers, and its x86 kernels take no int8 activation): both run as QLinearConv,
    within one quantization step of the reference engine's values."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(8))
    model, options = TwoBranches().eval(), dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], **options)
    engine = Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes())
    ops = _executed_ops(engine.network, tmp_path, x)
    assert ops.count("QLinearConv") == 2 and "Conv" not in ops and "FusedConv" not in ops, ops
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    steps = [float(q.weights["scale"]) for q in engine.network.layers if isinstance(q, L.QuantizeLayer)]
    _assert_within_one_step(compiled(x), reference(x), max(steps))


def _assert_within_one_step(out: torch.Tensor, ref: torch.Tensor, step: float) -> None:
    """ONNX Runtime's integer kernels requantize otherwise than float32 at a last bit from a half step: the output
    differs from the reference engine's by at most one step of its quantizer (the difference of two dequantized
    float32 values, so plus their rounding), at under 3% of values (a residual block's QLinearConv and QLinearAdd
    chain: 1.8% with 7-bit weights on an AVX2 CPU; a saturating integer kernel is off by thousands of steps)."""
    bound = step * (1 + 1e-6) + torch.finfo(torch.float32).eps * float(ref.abs().max())
    assert float((out - ref).abs().max()) <= bound and float((out != ref).float().mean()) < 0.03, \
        (float((out - ref).abs().max()), step, float((out != ref).float().mean()))


class ConvReluConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_convolution_relu_convolution_stays_in_int8_on_onnx_runtime(tmp_path):
    """A ReLU between two quantized convolutions gets the one quantizer, over [0, amax] (uint8's range, twice the
    resolution of a symmetric one): ORT drops the ReLU into the first QLinearConv, whose uint8 output the second
    reads, with no float step between. Within one output step of the reference engine, at few values."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    model, options = ConvReluConv().eval(), dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], **options)
    layers = _network(compiled)
    quantizers = [q for q in layers if isinstance(q, L.QuantizeLayer)]
    relu_q = next(q for q in quantizers if isinstance(q.inputs[0].producer, L.ActivationLayer))
    assert int(relu_q.weights["zero_point"]) == -128 and len(quantizers) == 3  # input, ReLU, second output
    ops = _executed_ops(Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network,
                        tmp_path, x)
    first = ops.index("QLinearConv")
    assert ops[first:first + 2] == ["QLinearConv"] * 2 and not {"Relu", "Conv", "FusedConv"} & set(ops), ops
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    out, ref = compiled(x), reference(x)
    step = float(next(q for q in reversed(quantizers)).weights["scale"])
    _assert_within_one_step(out, ref, step)
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(out.flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.999


def test_residual_add_runs_as_qlinearadd_between_integer_convolutions(tmp_path):
    """A residual block's add of two quantized values, then ReLU, reads both addends dequantized (its identity
    through the quantizer the block's first convolution reads it by) and its output quantized over [0, amax]: ORT
    runs QLinearAdd with the ReLU dropped. Within one step of the reference engine's values, at few values; close
    to fp32."""
    from torchkiln.examples.models import BasicBlock, randomize_batch_norm

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), BasicBlock(16, 16),
                                torch.nn.Conv2d(16, 8, 1)).eval()
    randomize_batch_norm(model)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(10))
    options = dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], **options)
    ops = _executed_ops(Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network,
                        tmp_path, x)
    assert ops.count("QLinearAdd") == 1 and ops.count("QLinearConv") == 4 and "Add" not in ops, ops
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    out, ref = compiled(x), reference(x)
    step = float([q for q in _network(compiled) if isinstance(q, L.QuantizeLayer)][-1].weights["scale"])
    _assert_within_one_step(out, ref, step)
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(out.flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.999


class ConvPoolConv(torch.nn.Module):
    """A ResNet stem and the convolution after it: convolution, ReLU (or ReLU6), 3x3/2 max pooling, convolution."""

    def __init__(self, activation: torch.nn.Module) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 8, 3, padding=1)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.max_pool2d(self.activation(self.a(x)), 3, 2, 1))


@pytest.mark.parametrize("activation", [torch.nn.ReLU(), torch.nn.ReLU6()], ids=["relu", "relu6"])
def test_max_pooling_between_quantized_convolutions_runs_on_uint8(activation, tmp_path):
    """A ReLU (or ReLU6) whose output a max pooling reads goes into its convolution's quantizer ([0, amax]), and the
    quantizer after the pooling takes that scale and zero point: ORT runs QLinearConv (the ReLU or Clip dropped), a
    uint8 max pooling and QLinearConv in one layout, with no Transpose between. Within one output step of the
    reference engine, at few values; close to fp32."""
    torch.manual_seed(4)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(11)) * 4
    model, options = ConvPoolConv(activation).eval(), dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], **options)
    layers = _network(compiled)
    pool = next(layer for layer in layers if isinstance(layer, L.PoolingLayer))
    before, after = pool.inputs[0].producer.inputs[0].producer, next(
        q for q in layers if isinstance(q, L.QuantizeLayer) and q.inputs[0] is pool.outputs[0])
    assert isinstance(before.inputs[0].producer, L.ActivationLayer) and int(before.weights["zero_point"]) == -128
    assert torch.equal(after.weights["scale"], before.weights["scale"]) and int(after.weights["zero_point"]) == -128
    ops = _executed_ops(Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network,
                        tmp_path, x)
    first = ops.index("QLinearConv")
    assert ops[first:first + 3] in (["QLinearConv", name, "QLinearConv"] for name in ("MaxPool", "NhwcMaxPool")) \
        and not {"Relu", "Clip", "Conv", "FusedConv"} & set(ops) and ops.count("Transpose") <= 2, ops
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    out, ref = compiled(x), reference(x)
    step = float([q for q in layers if isinstance(q, L.QuantizeLayer)][-1].weights["scale"])
    _assert_within_one_step(out, ref, step)
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(out.flatten(), model(x).flatten(), dim=0)
    assert cosine > 0.999


class QatPool(torch.nn.Module):
    """A QAT graph's stem: convolution, ReLU and max pooling, the pooling's input and output fake-quantized by one
    uint8 scale, then a convolution whose output is quantized."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(12)
        self.w0 = torch.nn.Parameter(torch.randn(8, 3, 3, 3, generator=gen) * 0.3)
        self.w1 = torch.nn.Parameter(torch.randn(4, 8, 3, 3, generator=gen) * 0.3)
        self.register_buffer("scale0", self.w0.detach().abs().amax((1, 2, 3)) / 127)
        self.register_buffer("scale1", self.w1.detach().abs().amax((1, 2, 3)) / 127)
        self.register_buffer("zero0", torch.zeros(8, dtype=torch.int32))
        self.register_buffer("zero1", torch.zeros(4, dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -128, 127)
        w0 = torch.fake_quantize_per_channel_affine(self.w0, self.scale0, self.zero0, 0, -127, 127)
        y = torch.fake_quantize_per_tensor_affine(torch.relu(torch.nn.functional.conv2d(x, w0, padding=1)), 0.04, 0,
                                                  0, 255)
        y = torch.fake_quantize_per_tensor_affine(torch.nn.functional.max_pool2d(y, 3, 2, 1), 0.04, 0, 0, 255)
        w1 = torch.fake_quantize_per_channel_affine(self.w1, self.scale1, self.zero1, 0, -127, 127)
        return torch.fake_quantize_per_tensor_affine(torch.nn.functional.conv2d(y, w1, padding=1), 0.25, 0, -128, 127)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_qat_max_pooling_between_quantizers_of_one_scale_matches_eager(backend, tmp_path):
    """Fake quantization before and after a max pooling by one scale and zero point is the pooling of the quantized
    values (quantization is monotonic and non-decreasing): ORT runs it so, on uint8 between its QLinearConvs, and
    gives eager's values, within one output step at few values (its QLinearConvs requantize otherwise than float32
    at a last bit from a half step: Backends in docs/quantization.md)."""
    model = QatPool().eval()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(13)) * 3
    compiled = torchkiln.compile(model, [x], enabled_precisions={I8}, min_block_size=1, backend=backend)
    with torch.no_grad():
        ref = model(x)
    out = compiled(x)
    if backend == "reference":
        assert_matches_eager(out, ref, rtol=0)
        return
    engine = Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes())
    assert not engine.reference_layers()
    ops = _executed_ops(engine.network, tmp_path, x)
    first = ops.index("QLinearConv")
    assert ops[first:first + 3] in (["QLinearConv", name, "QLinearConv"] for name in ("MaxPool", "NhwcMaxPool")) \
        and "Relu" not in ops and ops.count("Transpose") <= 2, ops
    _assert_within_one_step(out, ref, 0.25)


@pytest.mark.parametrize("winner", [0, 1], ids=["quantized-kept", "float16-kept"])
def test_a_quantized_engine_competes_with_its_half_precision_build(monkeypatch, caplog, winner):
    """With float16 enabled beside int8, the block is built both ways and the faster kept (the timing, whose
    choice is forced here either way): the quantized engine, or the float16 one with a warning that says why and
    how to force quantization. The quantized engine's own warning (its outputs' cosine, under a floor raised here)
    is a warning only where it is kept. Either way the answer matches eager."""
    from torchkiln.builder import engine_timing, quantization

    labels = []
    monkeypatch.setattr(engine_timing, "faster_engine",
                        lambda engines, inputs, names: labels.extend(names) or winner)
    monkeypatch.setattr(quantization, "NETWORK_COSINE", 1.01)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
    x = torch.randn(16, 64)
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        compiled = torchkiln.compile(model, [x], backend="reference", enabled_precisions={torch.half, I8},
                                     calibration_inputs=[x])
    assert labels == ["int8 and float16", "float16 alone"]
    quantized = [layer for layer in _network(compiled) if isinstance(layer, L.QuantizeLayer)]
    assert bool(quantized) == (winner == 0)
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert ("built in float16 alone, which ran faster" in warnings) == (winner == 1)
    assert ("outputs' cosine against float32" in warnings) == (winner == 0)
    assert "outputs' cosine against float32" in caplog.text  # logged either way
    with torch.no_grad():
        out, ref = compiled(x).float(), model(x)
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cosine > 0.999, cosine


def test_a_quantized_engine_without_a_half_type_enabled_is_not_timed_against_float(monkeypatch):
    from torchkiln.builder import engine_timing

    monkeypatch.setattr(engine_timing, "faster_engine", lambda *args: pytest.fail("timed against a float build"))
    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).eval()
    x = torch.randn(16, 64)
    compiled = torchkiln.compile(model, [x], backend="reference", enabled_precisions={I8}, calibration_inputs=[x],
                                 min_block_size=1)
    assert any(isinstance(layer, L.QuantizeLayer) for layer in _network(compiled))


def test_a_cache_calibrator_with_a_half_type_enabled_keeps_the_quantized_engine(trained, tmp_path, caplog):
    """A CacheCalibrator has no data to time the half-precision build on: the quantized engine is kept, as before
    the timed choice (which would otherwise make the compile fail asking for samples)."""
    cache = tmp_path / "calibration.json"
    x, _ = _digits(BATCH, 7)
    spec = [torchkiln.Input((BATCH, 1, 8, 8))]
    options = dict(backend="reference", min_block_size=1)
    torchkiln.compile(trained["cnn"], spec, enabled_precisions={I8}, calibration_inputs=[x],
                      calibration_cache_file=str(cache), calibration_algorithm="max", **options)
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        again = torchkiln.compile(trained["cnn"], spec, enabled_precisions={torch.half, I8},
                                  calibrator=torchkiln.ptq.CacheCalibrator(str(cache), "max"), **options)
    assert "not timed against its float16 build" in caplog.text
    assert any(isinstance(layer, L.QuantizeLayer) for layer in _network(again))


@pytest.mark.parametrize("vnni", [False, True], ids=["avx2-only", "vnni"])
def test_int8_weights_fit_the_cpus_exact_integer_kernels(monkeypatch, tmp_path, vnni):
    """On an x86 CPU without VNNI, ORT's uint8 x int8 kernels add products in saturating 16-bit pairs: post-training
    quantization for the CPU then gives weights in [-64, 64] (2 x 255 x 64 fits), and the backend's own session runs
    them on the integer kernels (QLinearConv), within one quantization step of the reference engine. With VNNI the
    weights use all of [-127, 127] (run on the integer kernels only where this CPU has VNNI: elsewhere they saturate,
    as `integer_kernels` says)."""
    from torchkiln.runtime import integer_kernels
    from torchkiln.runtime.backends.onnxruntime import _Session

    runs_here = not vnni or integer_kernels.integer_kernels_exact()
    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: vnni)
    torch.manual_seed(3)
    model = ConvReluConv().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(10))
    options = dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], **options)
    network = Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network
    convs = [c for c in network.layers if isinstance(c, L.ConvolutionLayer) and c.kernel_type == I8]
    assert len(convs) == 2
    top = 127 if vnni else integer_kernels.NARROW_WEIGHT_MAX
    for conv in convs:
        q = conv.weights["kernel"] / conv.weights["kernel_scale"].reshape(-1, 1, 1, 1)
        assert float(q.abs().amax()) == pytest.approx(top, abs=1e-3)  # each channel's largest at the top
    assert integer_kernels.exact_for(network)
    if not runs_here:
        return
    session = _Session(ort, network, 1, False, profile_prefix=str(tmp_path / "profile"))
    session.run([x])
    with open(session.session.end_profiling(), encoding="utf-8") as f:
        ops = [e["args"]["op_name"] for e in json.load(f) if e.get("cat") == "Node"
               and e["name"].endswith("_kernel_time")]
    assert ops.count("QLinearConv") == 2, ops
    reference = torchkiln.compile(model, [x], backend="reference", **options)
    steps = [float(q.weights["scale"]) for q in network.layers if isinstance(q, L.QuantizeLayer)]
    _assert_within_one_step(compiled(x), reference(x), max(steps))


def _quantized_matmul(weight: torch.Tensor, activation_product: bool = False):
    """x [4, 8] quantized, times an int8 constant `weight` [8, 8] dequantized per column (or, with
    `activation_product`, times x quantized again: a product of two dequantized activations), plus a bias."""
    from torchkiln.ir.network import Network

    net = Network("quantized")
    x = net.add_input("x", torch.float32, (4, 8))
    qx = net.add_fake_quantize(x, torch.tensor([0.05]), None, I8)
    w = net.add_layer(L.DequantizeLayer, [net.add_constant(weight).get_output()],
                      weights={"scale": torch.full((8,), 0.01)}, axis=1, quant_type=I8).get_output()
    other = net.add_fake_quantize(x, torch.tensor([0.1]), None, I8) if activation_product else w
    op = L.MatrixOperation.TRANSPOSE if activation_product else L.MatrixOperation.NONE
    mm = net.add_matrix_multiply(qx, L.MatrixOperation.NONE, other, op)
    mm.weights = {"bias": torch.linspace(-1, 1, mm.outputs[0].shape[-1])}
    net.mark_output(mm.get_output())
    return net


NARROW, WIDE = torch.full((8, 8), 64, dtype=I8), torch.full((8, 8), 65, dtype=I8)


def test_which_int8_networks_the_integer_kernels_run_exactly_without_vnni(monkeypatch):
    """Where ORT's uint8 x int8 kernels would saturate (no VNNI), a network with an int8 weight past 64 (a QAT
    graph's own 8-bit weights) is exact on them only with its weights written as uint8; 7-bit weights are as they
    are; a product of two dequantized int8 activations is not (its session runs Q/DQ in float); with VNNI every
    network is."""
    from torchkiln.runtime import integer_kernels

    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: False)
    exact = integer_kernels.exact_for
    assert exact(_quantized_matmul(NARROW)) and not exact(_quantized_matmul(WIDE))
    assert exact(_quantized_matmul(WIDE), unsigned_weights=True)  # written as uint8
    assert not exact(_quantized_matmul(NARROW, activation_product=True), unsigned_weights=True)
    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: True)
    assert exact(_quantized_matmul(WIDE)) and exact(_quantized_matmul(NARROW, activation_product=True))


def _session_ops(session) -> list[str]:
    with open(session.session.end_profiling(), encoding="utf-8") as f:
        return [e["args"]["op_name"] for e in json.load(f) if e.get("cat") == "Node"
                and e["name"].endswith("_kernel_time")]


def test_wide_int8_weights_run_exactly_on_integer_kernels_as_uint8_without_vnni(monkeypatch, tmp_path):
    """On a CPU without VNNI (simulated where the CPU has it), a linear layer with 8-bit weights (65: past what
    uint8 x int8 pair sums hold) runs on MatMulIntegerToFloat with its weights written as uint8 (value + 128, zero
    point 128), whose kernels widen before adding: the reference engine's values within float32 rounding. A stored
    session model (the module cache, exported where int8 weights were exact) is not used then."""
    from torchkiln.runtime import integer_kernels
    from torchkiln.runtime.backends.onnxruntime import _Session
    from torchkiln.runtime.executor import ReferenceExecutor

    torch.manual_seed(0)
    weight = torch.randint(-127, 128, (8, 8), dtype=I8)
    weight[0, 0] = 127
    network = _quantized_matmul(weight)
    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: True)
    stored = session_onnx(network).SerializeToString()
    b = next(i for i in onnx.load_from_string(stored).graph.initializer if i.data_type == onnx.TensorProto.INT8)
    assert b.dims == [8, 8]  # the stored model holds the int8 weight
    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: False)
    x = 3 * torch.randn(4, 8)
    session = _Session(ort, network, 1, False, profile_prefix=str(tmp_path / "profile"), model=stored)
    out = session.run([x])[0]
    assert "MatMulIntegerToFloat" in _session_ops(session)
    written = onnx.load(session.optimized_model)
    assert not any(i.data_type == onnx.TensorProto.INT8 for i in written.graph.initializer)  # exported again
    ref = ReferenceExecutor(network, torch.device("cpu")).run([x])[0]
    assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_a_qat_convolution_runs_exactly_on_integer_kernels_without_vnni(monkeypatch, tmp_path):
    """A convolution with 8-bit weights (post-training quantization's, as on a VNNI CPU; a QAT graph's are the same)
    runs as QLinearConv on a CPU without VNNI (simulated where the CPU has it), its kernel written as uint8: within
    one quantization step of the reference engine, where uint8 x int8 sums saturated (4.0 off on such a CPU)."""
    from torchkiln.runtime import integer_kernels
    from torchkiln.runtime.backends.onnxruntime import _Session

    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: True)  # 8-bit weights
    torch.manual_seed(3)
    model = ConvReluConv().eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(10))
    options = dict(enabled_precisions={I8}, calibration_inputs=[x])
    compiled = torchkiln.compile(model, [x], backend="reference", **options)
    network = Engine.deserialize(getattr(compiled, engine_attrs(compiled)[0]).numpy().tobytes()).network
    monkeypatch.setattr(integer_kernels, "integer_kernels_exact", lambda: False)
    assert not integer_kernels.exact_for(network) and integer_kernels.exact_for(network, unsigned_weights=True)
    session = _Session(ort, network, 1, False, profile_prefix=str(tmp_path / "profile"))
    out = session.run([x])[0]
    assert _session_ops(session).count("QLinearConv") == 2
    steps = [float(q.weights["scale"]) for q in network.layers if isinstance(q, L.QuantizeLayer)]
    _assert_within_one_step(out, compiled(x), max(steps))


def _two_linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def test_a_calibration_sample_of_another_shape_is_named():
    from torchkiln.errors import EngineInputError

    with pytest.raises(EngineInputError, match=r"calibration sample 1: engine input 0 .*expected shape \(8, 16\), "
                                               r"got \(8, 17\)"):
        torchkiln.compile(_two_linear(), [torchkiln.Input((8, 16))], enabled_precisions={I8},
                          calibration_inputs=[torch.randn(8, 16), torch.randn(8, 17)])


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), 0.0], ids=["nan", "inf", "zeros"])
def test_degenerate_calibration_samples_are_named_and_unranged_layers_stay_float(fill, caplog):
    """A sample of NaN, infinities or zeros gives the first layer no range (every finite |value| 0): it stays in
    float, with the reason (quantized with a range of 0, its outputs were 0.3 off), and the log names the sample."""
    model = _two_linear()
    x = torch.randn(8, 16)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled, report = compile_with_report(model, [torchkiln.Input((8, 16))], enabled_precisions={I8},
                                               calibration_inputs=[torch.full((8, 16), fill)])
    assert "calibration sample 0, input 0" in caplog.text
    assert ("is constant" if fill == 0 else "NaN or infinite values") in caplog.text
    first = report.fp32_layers[0]
    assert first.kind == "matrix_multiply" and "no range to quantize it to" in first.reason, report.fp32_layers
    if fill != 0:  # nothing quantized: the engine computes in float
        with torch.no_grad():
            assert (compiled(x) - model(x)).abs().max().item() <= 1e-4 * model(x).abs().max().item()


def test_a_calibration_cache_file_that_is_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="calibration_cache_file must be a file path, got the folder"):
        torchkiln.compile(_two_linear(), [torchkiln.Input((8, 16))], enabled_precisions={I8},
                          calibration_inputs=[torch.randn(8, 16)], calibration_cache_file=str(tmp_path))
