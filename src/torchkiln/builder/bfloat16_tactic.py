"""bfloat16 on the CPU as a tactic: where a compile asks for bfloat16 on the onnxruntime backend and the CPU computes
bfloat16 natively (AVX512-BF16 or AMX), each engine is built twice, in float32 for ONNX Runtime (whose CPU provider
has almost no bfloat16 kernels) and in bfloat16 on the reference backend (ATen, whose matrix multiplies and
convolutions run oneDNN's bfloat16 kernels), and the faster on the block's own inputs is kept
(builder/engine_timing.py).

The bfloat16 build goes through precision safety like any reduced-precision build: layers that overflow or lose
precision in bfloat16 on the calibration inputs stay in float32 (builder/calibration.py). Measured on this project's
2-core AVX512-BF16 machine, an encoder of 4 attention layers (width 256, sequence 128) at batch 8 ran 14.0 ms in
bfloat16 against 17.9 ms in ONNX Runtime's float32 (cosine 0.99998 against float32 eager); at batch 1 the two tie.
"""
from __future__ import annotations

import dataclasses

import torch

from torchkiln.builder.settings import BuildSettings


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 arithmetic (AVX512-BF16 or AMX tiles)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def applies(asked: torch.dtype, backend: str, device: torch.device) -> bool:
    """Whether a compile asking for `asked` on `backend` and `device` takes the tactic."""
    return asked == torch.bfloat16 and backend == "onnxruntime" and device.type == "cpu" and cpu_computes_bfloat16()


def bfloat16_alternative(build: BuildSettings, asked: torch.dtype) -> BuildSettings | None:
    """The bfloat16 reference build to time against `build` (an onnxruntime build in float32 because bfloat16 was
    asked for), or None where the tactic does not apply."""
    if not applies(asked, build.backend, build.device):
        return None
    return dataclasses.replace(build, compute_dtype=torch.bfloat16, backend="reference")
