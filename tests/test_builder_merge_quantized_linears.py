"""merge_quantized_linears: quantized linear layers of one quantized input become one multiply and column slices."""
import copy

import pytest
import torch

import torchkiln
from torchkiln.builder import BuildSettings
from torchkiln.builder.passes.merge_quantized_linears import merge_quantized_linears
from torchkiln.builder.passes.quantize import quantize_weight
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime.executor import ReferenceExecutor

I8 = torch.int8
CUDA = BuildSettings(backend="cuda")  # the backend the pass merges for


def _linears(widths=(48, 48, 32), scales=(0.05, 0.05, 0.05), bias=True, batch=(3, 7)) -> Network:
    """x -> quantize (shared) -> per multiply: its own dequantize -> @ W_i.T (+ b_i) -> its own reader (a ReLU)."""
    gen = torch.Generator().manual_seed(0)
    net = Network("q")
    x = net.add_input("x", torch.float32, (*batch, 40))
    quantizers = {}
    for width, scale in zip(widths, scales):
        if scale not in quantizers:
            quantizers[scale] = net.add_layer(L.QuantizeLayer, [x], weights={"scale": torch.tensor([scale])},
                                              quant_type=I8, divide=True).get_output()
        dq = net.add_layer(L.DequantizeLayer, [quantizers[scale]], weights={"scale": torch.tensor([scale])},
                           quant_type=I8).get_output()
        w, w_scale = quantize_weight(torch.randn(width, 40, generator=gen) / 6, 0, I8)
        dqw = net.add_layer(L.DequantizeLayer, [net.add_constant(w).get_output()], weights={"scale": w_scale},
                            axis=0, quant_type=I8).get_output()
        mm = net.add_matrix_multiply(dq, L.MatrixOperation.NONE, dqw, L.MatrixOperation.TRANSPOSE)
        if bias:
            mm.weights = {"bias": torch.randn(width, generator=gen)}
        net.mark_output(net.add_activation(mm.get_output(), L.ActivationType.RELU).get_output())
    return net


def _run(net: Network, x: torch.Tensor) -> list[torch.Tensor]:
    return ReferenceExecutor(net, torch.device("cpu")).run([x])


def _kinds(net: Network) -> list[str]:
    return [layer.KIND for layer in net.layers]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_multiplies_of_one_quantizer_become_one_of_their_weights_and_slices(bias):
    net = _linears(bias=bias)
    before = copy.deepcopy(net)
    x = torch.randn(3, 7, 40, generator=torch.Generator().manual_seed(1)) * 3
    assert merge_quantized_linears(net, CUDA)
    products = [layer for layer in net.layers if isinstance(layer, L.MatrixMultiplyLayer)]
    assert len(products) == 1 and products[0].outputs[0].shape == (3, 7, 128)
    assert _kinds(net).count("slice") == 3 and _kinds(net).count("dequantize") == 2
    assert [s.shape for s in net.outputs] == [(3, 7, 48), (3, 7, 48), (3, 7, 32)]
    ref = _run(before, x)
    for got, want in zip(_run(net, x), ref):  # the same sums: fp32 rounding apart
        assert want.abs().max() > 1.0
        assert (got - want).abs().max().item() <= 1e-6 * want.abs().max().item()


def test_multiplies_of_different_quantizers_stay_apart():
    net = _linears(widths=(48, 48, 32), scales=(0.05, 0.05, 0.02))
    assert merge_quantized_linears(net, CUDA)
    assert [layer.outputs[0].shape[-1] for layer in net.layers if isinstance(layer, L.MatrixMultiplyLayer)] == [96, 32]


def test_a_weight_read_elsewhere_is_not_merged():
    net = _linears(widths=(48, 48))
    dqw = next(layer for layer in net.layers if isinstance(layer, L.DequantizeLayer) and layer.axis == 0)
    net.mark_output(dqw.outputs[0])
    assert not merge_quantized_linears(net, CUDA)


def test_a_product_the_network_returns_is_not_merged():
    net = _linears(widths=(48, 48, 32))
    product = next(layer for layer in net.layers if isinstance(layer, L.MatrixMultiplyLayer))
    net.mark_output(product.outputs[0])
    assert merge_quantized_linears(net, CUDA)
    assert [layer.outputs[0].shape[-1] for layer in net.layers if isinstance(layer, L.MatrixMultiplyLayer)] == [48, 80]


def test_dynamic_batch_slices_keep_the_symbolic_dims():
    batch = DimSymbol("batch", 1, 64)
    net = _linears(batch=(batch, 7))
    assert merge_quantized_linears(net, CUDA)
    assert [s.shape for s in net.outputs] == [(batch, 7, 48), (batch, 7, 48), (batch, 7, 32)]


class _Attention(torch.nn.Module):
    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        y = self.norm(x)
        q, k, v = (p(y).reshape(b, t, self.heads, w // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return x + self.o(a.transpose(1, 2).reshape(b, t, w))


def test_onnx_runtime_engines_keep_the_projections_apart():
    """ONNX Runtime copies each slice, so its int8 engines keep query, key and value as three multiplies."""
    from torchkiln.compiler import compile_with_report
    from torchkiln.runtime.engine import Engine
    from torchkiln.stitching.stitch import engine_attrs

    torch.manual_seed(0)
    model = _Attention().eval()
    x = torch.randn(2, 16, 64)
    module, _ = compile_with_report(model, [torchkiln.Input(x.shape)], enabled_precisions={I8},
                                    calibration_inputs=[(torch.randn(2, 16, 64),)])
    network = Engine.deserialize(getattr(module, engine_attrs(module)[0]).numpy().tobytes()).network
    assert [layer.outputs[0].shape for layer in network.layers if isinstance(layer, L.MatrixMultiplyLayer)] == \
        [(2, 16, 64)] * 4
    assert not merge_quantized_linears(copy.deepcopy(network), BuildSettings(backend="onnxruntime"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU plan runs in Triton's interpreter")
@pytest.mark.usefixtures("triton_interpreter")
def test_the_cuda_plan_runs_the_merged_multiply_as_one_generated_gemm(monkeypatch):
    """The cuda backend's plan of the merged network (Triton's interpreter): one generated quantized GEMM for the
    three multiplies, its outputs' slices views, against the reference meaning of the network before the pass."""
    pytest.importorskip("triton", reason="triton is not installed")
    from harness import run_plan_eagerly

    from torchkiln.runtime.backends import BackendOptions
    from torchkiln.runtime.backends.cuda import gemm_tactic, planner
    from torchkiln.runtime.backends.cuda.quant_kernels import GENERATED_OP

    net = _linears()
    before = copy.deepcopy(net)
    assert merge_quantized_linears(net, CUDA)
    monkeypatch.setattr(gemm_tactic, "choose", lambda network, requests, *args: [
        "16,16,32,1,4,2,1" if r.kind == GENERATED_OP else None for r in requests])
    plan = planner.make_plan(net, torch.device("cpu"), BackendOptions(timing_iterations=0))
    ops = [plan.kernels[s.kernel].op for s in plan.steps]
    assert ops.count(GENERATED_OP) == 1 and ops.count("slice") == 3, ops
    x = torch.randn(3, 7, 40, generator=torch.Generator().manual_seed(1)) * 3
    for got, want in zip(run_plan_eagerly(net, plan, [x]), _run(before, x)):
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
