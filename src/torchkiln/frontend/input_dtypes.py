"""Inputs given without a dtype take the model's: Torch-TensorRT infers an unset input type from the graph's
first calculation (a float16 model's inputs are float16); torchkiln takes the dtype of the model's first
floating-point parameter or buffer, and float32 for a model without one."""
from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any

import torch

from torchkiln.settings import CompileSettings, Input, flatten_signature

logger = logging.getLogger("torchkiln")
HALF_DTYPES = (torch.float16, torch.bfloat16)


def parameter_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the module's first floating-point parameter or buffer."""
    return next((t.dtype for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()),
                None)


def _map(signature: Any, fn: Any) -> Any:
    if isinstance(signature, Input):
        return fn(signature)
    if isinstance(signature, dict):
        return {k: _map(v, fn) for k, v in signature.items()}
    return type(signature)(_map(v, fn) for v in signature)


def infer_input_dtypes(settings: CompileSettings, module: torch.nn.Module) -> CompileSettings:
    """`settings` with each Input given without a dtype set to the module's half-precision parameter dtype
    (unchanged where the parameters are float32 or there are none: those Inputs are float32 already)."""
    dtype = parameter_dtype(module)
    if dtype not in HALF_DTYPES or all(spec.explicit_dtype for spec in settings.inputs):
        return settings

    def infer(spec: Input) -> Input:
        if spec.explicit_dtype:
            return spec
        spec = copy.copy(spec)
        spec.dtype = dtype
        return spec

    signature = tuple(_map(settings.input_signature, infer))
    logger.info("inputs given without a dtype take the model's parameter dtype %s (as Torch-TensorRT infers "
                "an unset input type)", dtype)
    return dataclasses.replace(settings, input_signature=signature, inputs=tuple(flatten_signature(signature)))
