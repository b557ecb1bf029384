"""Times depthwise 2-D convolutions with their bias and activation on the GPU: cuDNN channels-last, cuDNN NCHW (the
input converted from channels-last and the output back, as the planner counts them) and the generated kernel
(codegen/depthwise.py) in each candidate tile configuration, against the time the memory traffic needs.

    python scripts/depthwise_bench.py [--dtype fp16|fp32] [--batch 32] [--only 7x7]

Each run is checked against F.conv2d first; times are replays of a CUDA graph (as the engine runs), so launch
costs on the host do not count. Shapes are those of ConvNeXt-, EfficientNet- and MobileNetV3-style blocks (window,
stride, dilation, channels, input size, activation); run with PYTHONPATH=src.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen.depthwise import Config, DepthwiseLauncher, candidates, lay_out


# (window, stride, dilation, channels, input height = width, activation)
SHAPES = [
    (7, 1, 1, 192, 56, None), (7, 1, 1, 384, 28, None), (7, 1, 1, 768, 14, None),
    (3, 1, 1, 32, 112, "silu"), (3, 2, 1, 96, 112, "silu"), (5, 2, 1, 144, 56, "silu"), (3, 1, 1, 240, 28, "silu"),
    (5, 1, 1, 672, 14, "silu"), (5, 2, 1, 672, 14, "silu"), (3, 1, 1, 1152, 7, "silu"),
    (3, 2, 1, 64, 112, "relu"), (5, 2, 1, 72, 56, "relu"), (5, 1, 1, 960, 7, "hardswish"),
    (5, 1, 2, 960, 28, "hardswish"),
]
ACTIVATIONS = {"silu": (L.ActivationType.SILU, F.silu), "relu": (L.ActivationType.RELU, torch.relu),
               "hardswish": (L.ActivationType.HARD_SWISH, F.hardswish), None: (None, lambda v: v)}
PEAK_BYTES_PER_S = 3.35e12  # H100 SXM HBM3


def _layers(batch, k, stride, dil, c, size, act, dtype):
    pad = dil * (k - 1) // 2
    out = (size + 2 * pad - dil * (k - 1) - 1) // stride + 1
    x, y = Tensor("x", (batch, c, size, size), dtype), Tensor("y", (batch, c, out, out), dtype)
    kernel, bias = (torch.randn(c, 1, k, k) / k).to(dtype), torch.randn(c).to(dtype)
    conv = L.ConvolutionLayer(name="dw", inputs=[x], outputs=[y], weights={"kernel": kernel, "bias": bias},
                              stride=(stride, stride), padding=(pad, pad), dilation=(dil, dil), groups=c)
    kind = ACTIVATIONS[act][0]
    if kind is None:
        return conv, [], y, pad
    z = Tensor("z", y.shape, dtype)
    return conv, [L.ActivationLayer(name="act", inputs=[y], outputs=[z], weights={}, type=kind)], z, pad


def bench(batch: int, dtype: torch.dtype, only: str | None, extra: list[Config]) -> None:
    from triton.testing import do_bench_cudagraph as do_bench  # replayed from a CUDA graph, as the engine runs

    cl = torch.channels_last
    print(f"{'shape':44} {'traffic':>8} {'cudnn CL':>9} {'cudnn NCHW':>10} {'generated':>9}  best config "
          f"(us; {torch.cuda.get_device_name()}, {dtype})")
    for k, stride, dil, c, size, act in SHAPES:
        name = f"{k}x{k} s{stride} d{dil} [{batch},{c},{size},{size}] {act or 'bias'}"
        if only and only not in name:
            continue
        conv, rest, out, pad = _layers(batch, k, stride, dil, c, size, act, dtype)
        x = torch.randn(batch, c, size, size, device="cuda", dtype=dtype).contiguous(memory_format=cl)
        w, b = conv.weights["kernel"].cuda(), conv.weights["bias"].cuda()
        fn = ACTIVATIONS[act][1]
        args = ((stride, stride), (pad, pad), (dil, dil), c)
        w_cl = w.contiguous(memory_format=cl)

        def cudnn_cl():
            return fn(F.conv2d(x, w_cl, b, *args))

        def cudnn_nchw():
            return fn(F.conv2d(x.contiguous(), w, b, *args)).contiguous(memory_format=cl)

        ref = fn(F.conv2d(x.float(), w.float(), b.float(), *args))
        times = {"cudnn CL": do_bench(cudnn_cl), "cudnn NCHW": do_bench(cudnn_nchw)}
        generated = {}
        for config in [*candidates(*out.shape), *extra]:
            launch = DepthwiseLauncher(conv, rest, [], [out], config)
            weight = lay_out(w)
            got = launch(x, weight, b, [])[0]
            err = (got.float() - ref).abs().max().item() / ref.abs().max().item()
            if err > (1e-2 if dtype != torch.float32 else 1e-4):
                raise SystemExit(f"{name}: generated {config.text()} is off by {err:.2e} of the largest value")
            generated[config.text()] = do_bench(lambda launch=launch, weight=weight: launch(x, weight, b, []))
        best = min(generated, key=generated.get)
        traffic = batch * c * (size * size + out.shape[2] * out.shape[3]) * x.element_size()
        print(f"{name:44} {traffic / PEAK_BYTES_PER_S * 1e6:8.1f} {times['cudnn CL'] * 1e3:9.1f} "
              f"{times['cudnn NCHW'] * 1e3:10.1f} {generated[best] * 1e3:9.1f}  {best}  "
              f"(all: {', '.join(f'{k}={v * 1e3:.1f}' for k, v in generated.items())})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--only", help="only shapes whose name contains this text (e.g. 7x7)")
    parser.add_argument("--config", help="time this tile configuration (rows,block_w,block_c,warps) too")
    options = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    extra = [Config.parse(options.config)] if options.config else []
    bench(options.batch, torch.float16 if options.dtype == "fp16" else torch.float32, options.only, extra)


if __name__ == "__main__":
    main()
