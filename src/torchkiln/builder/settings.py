"""What the builder needs to know besides the network."""
from __future__ import annotations

import dataclasses

import torch

from torchkiln.runtime.backends.base import BackendOptions
from torchkiln.runtime.integer_kernels import FULL_WEIGHT_MAX


@dataclasses.dataclass(frozen=True)
class QuantizationPlan:
    """What post-training quantization quantizes: the layers (by name) with the amax of their activation input,
    and of their output where it is quantized too (convolutions: ONNX Runtime fuses QLinearConv only then), in
    `quant_type` (int8 or float8_e4m3fn)."""

    quant_type: torch.dtype
    activation_amax: tuple[tuple[str, float], ...] = ()
    output_amax: tuple[tuple[str, float], ...] = ()
    weight_max: int = FULL_WEIGHT_MAX  # int8 weights lie in [-weight_max, weight_max] (runtime/integer_kernels.py)


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """Precision to run float layers in, target device, and limits of the optimizations."""

    compute_dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    max_folded_elements: int = 1 << 20  # constant folding never makes a constant larger than this
    backend: str = "reference"  # what runs the engine (runtime.backends.BACKENDS), recorded in its bytes
    backend_options: BackendOptions = BackendOptions()  # how the backend is tuned, recorded in the engine's bytes
    # layers (by name) the low-precision pass computes in fp32 whatever their kind: the ones calibration found
    # overflowing or losing precision in fp16/bf16 (builder/calibration.py)
    keep_fp32: frozenset[str] = frozenset()
    quantization: QuantizationPlan | None = None  # layers to quantize (builder/passes/quantize.py)
