"""The generated int8 convolution against cuDNN's fp16 one, shape by shape: each of ResNet-50's 23 convolution shapes
(batch 32 by default) alone, the int8 kernel with the engine's own epilogue (an int8 input of zero point -128;
dequantize, bias, ReLU and the next layer's dividing quantize into int8; the int8 residual and its dequantize where
the block adds one) in each tile configuration given (by default the tactic's candidates for that shape,
`quantized_conv.candidates`), against cuDNN's fp16 channels-last convolution with the bias and ReLU (and the residual
add) fused (`torch.cudnn_convolution_relu` / `torch.cudnn_convolution_add_relu`). Kernel time from torch.profiler,
the mean of 20 calls after 3; the sums are weighted by how often each shape occurs in the network (52
convolutions). Not a test; docs/quantization.md has a run.

    PYTHONPATH=src python scripts/bench_quant_conv.py [--batch 32] [--configs "128,64,64,4,4;64,64,128,4,4"]
"""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from torchkiln.builder.passes.quantize import quantize_weight
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import dequantize
from torchkiln.runtime.backends import BackendOptions
from torchkiln.runtime.backends.cuda import gemm_tactic, planner
from torchkiln.runtime.backends.cuda.codegen import quantized_conv
from torchkiln.runtime.backends.cuda.quant_kernels import GENERATED_CONV_OP
from torchkiln.runtime.backends.cuda.runner import CudaRunner

I8 = torch.int8
ZERO, SCALE = -128, 0.02  # every activation's quantizer: post-ReLU values over [0, 255 x SCALE]
CALLS, WARMUP = 20, 3
# (input channels, output channels, window, stride, input size, residual added, how many in the network)
RESNET50 = [
    (64, 64, 1, 1, 56, False, 1), (64, 64, 3, 1, 56, False, 3), (64, 256, 1, 1, 56, True, 3),
    (64, 256, 1, 1, 56, False, 1), (256, 64, 1, 1, 56, False, 2), (256, 128, 1, 1, 56, False, 1),
    (128, 128, 3, 2, 56, False, 1), (128, 512, 1, 1, 28, True, 4), (256, 512, 1, 2, 56, False, 1),
    (512, 128, 1, 1, 28, False, 3), (128, 128, 3, 1, 28, False, 3), (512, 256, 1, 1, 28, False, 1),
    (256, 256, 3, 2, 28, False, 1), (256, 1024, 1, 1, 14, True, 6), (512, 1024, 1, 2, 28, False, 1),
    (1024, 256, 1, 1, 14, False, 5), (256, 256, 3, 1, 14, False, 5), (1024, 512, 1, 1, 14, False, 1),
    (512, 512, 3, 2, 14, False, 1), (512, 2048, 1, 1, 7, True, 3), (1024, 2048, 1, 2, 14, False, 1),
    (2048, 512, 1, 1, 7, False, 2), (512, 512, 3, 1, 7, False, 2),
]


def _dequantized(net: Network, q: object) -> object:
    weights = {"scale": torch.tensor([SCALE]), "zero_point": torch.tensor([ZERO], dtype=I8)}
    return net.add_layer(L.DequantizeLayer, [q], weights=weights, quant_type=I8).get_output()


def _network(batch: int, cin: int, cout: int, k: int, stride: int, size: int,
             residual: bool) -> tuple[Network, torch.Tensor]:
    """int8 in -> dequantize -> convolution (int8 kernel per channel) [+ dequantized int8 residual] -> ReLU ->
    quantize -> int8 out; and the float kernel."""
    net = Network("qconv")
    x = net.add_input("x", I8, (batch, cin, size, size))
    gen = torch.Generator().manual_seed(cin * 7 + cout)
    w = torch.randn(cout, cin, k, k, generator=gen) / (cin * k * k) ** 0.5
    q, scale = quantize_weight(w, 0, I8)
    conv = net.add_convolution_nd(_dequantized(net, x), dequantize(q, scale.reshape(-1, 1, 1, 1), None),
                                  torch.randn(cout, generator=gen), stride=(stride, stride), padding=(k // 2, k // 2),
                                  dilation=(1, 1), groups=1)
    conv.weights = {**conv.weights, "kernel_scale": scale}
    conv.kernel_type = I8
    y = conv.get_output()
    if residual:
        r = net.add_input("r", I8, (batch, cout, _out(size, k, stride), _out(size, k, stride)))
        y = net.add_elementwise(y, _dequantized(net, r), L.ElementWiseOperation.SUM).get_output()
    y = net.add_activation(y, L.ActivationType.RELU).get_output()
    weights = {"scale": torch.tensor([SCALE]), "zero_point": torch.tensor([ZERO], dtype=I8)}
    net.mark_output(net.add_layer(L.QuantizeLayer, [y], weights=weights, quant_type=I8, divide=True).get_output())
    return net, w


def _out(size: int, k: int, stride: int) -> int:
    return (size + 2 * (k // 2) - k) // stride + 1


@contextlib.contextmanager
def _tile(config: str) -> Iterator[None]:
    """The planner's quantized convolutions take `config` instead of a timed choice."""
    chosen = gemm_tactic.choose
    gemm_tactic.choose = lambda network, requests, *args: [config if r.kind == GENERATED_CONV_OP else None
                                                           for r in requests]
    try:
        yield
    finally:
        gemm_tactic.choose = chosen


def _kernel_us(fn: Callable[[], object], name: str | None = None) -> float:
    """Mean GPU time of one call of `fn` in us: every kernel's, or those whose name holds `name`."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages() if name is None or name in e.key) / CALLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--configs", default="", help="tile configurations to time, ';'-separated (default: the "
                                                       "tactic's candidates for each shape)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_quant_conv.py needs a CUDA GPU")
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    total_cudnn = total_int8 = 0.0
    print(f"{torch.cuda.get_device_name(device)}, batch {args.batch}; us per call (kernel time)")
    for cin, cout, k, stride, size, residual, count in RESNET50:
        net, w = _network(args.batch, cin, cout, k, stride, size, residual)
        gen = torch.Generator().manual_seed(cin + cout + k)
        oh = _out(size, k, stride)

        def quantized(*shape: int) -> torch.Tensor:
            values = torch.randint(-128, 127, shape, generator=gen, dtype=I8)
            return values.to(device).contiguous(memory_format=torch.channels_last)

        inputs = [quantized(args.batch, cin, size, size)] + ([quantized(args.batch, cout, oh, oh)] if residual else [])
        half = [x.half() for x in inputs]
        wh = w.half().to(device).contiguous(memory_format=torch.channels_last)
        bias = torch.randn(cout, generator=gen).half().to(device)
        window = ((stride, stride), (k // 2, k // 2), (1, 1), 1)
        cudnn = _kernel_us(lambda: torch.cudnn_convolution_add_relu(half[0], wh, half[1], 1.0, bias, *window)
                           if residual else torch.cudnn_convolution_relu(half[0], wh, bias, *window))
        configs = [c for c in args.configs.split(";") if c] or [
            c.text() for c in quantized_conv.candidates(args.batch * oh * oh, cout, cin * k * k, cin, sms)]
        times = {}
        for config in configs:
            with _tile(config):
                plan = planner.make_plan(net, device, BackendOptions(timing_iterations=0))
            runner = CudaRunner(net, plan, device, BackendOptions())
            times[config] = _kernel_us(lambda: runner.run(inputs), quantized_conv.KERNEL_NAME)
        best = min(times, key=times.get)
        total_cudnn += count * cudnn
        total_int8 += count * times[best]
        print(f"{cin:4d} -> {cout:4d} {k}x{k} stride {stride} at {size:3d}{' + residual' if residual else '':11} "
              f"x{count}: cuDNN fp16 {cudnn:6.1f}  int8 {times[best]:6.1f} ({best})  ratio {times[best] / cudnn:.2f}  "
              + " ".join(f"{c}={t:.1f}" for c, t in times.items() if c != best), flush=True)
    print(f"\nweighted by occurrence: cuDNN fp16 {total_cudnn:.0f} us, int8 {total_int8:.0f} us "
          f"(ratio {total_int8 / total_cudnn:.2f})")


if __name__ == "__main__":
    main()
