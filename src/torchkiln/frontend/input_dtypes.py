"""Inputs given without a dtype take the model's: Torch-TensorRT infers an unset input type from the graph's
first calculation (a float16 model's inputs are float16); torchkiln takes the dtype of the model's first
floating-point parameter or buffer when it is float16 or bfloat16. Other unset Inputs become float32 (as_input)."""
from __future__ import annotations

import logging
from typing import Any

import torch

from torchkiln.settings import Input

logger = logging.getLogger("torchkiln")
HALF_DTYPES = (torch.float16, torch.bfloat16)


def parameter_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the module's first floating-point parameter or buffer."""
    return next((t.dtype for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()),
                None)


def _map_inputs(inputs: Any, dtype: torch.dtype, found: list[Input]) -> Any:
    if isinstance(inputs, Input):
        if not inputs.explicit_dtype:
            found.append(inputs)
        return inputs.with_default_dtype(dtype)
    if isinstance(inputs, dict):
        return {k: _map_inputs(v, dtype, found) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_map_inputs(v, dtype, found) for v in inputs)
    return inputs


def infer_input_dtypes(inputs: Any, module: torch.nn.Module) -> Any:
    """`inputs` (nested lists, tuples and dicts) with each Input given without a dtype set to the module's
    half-precision parameter dtype; unchanged where the parameters are float32 or there are none."""
    dtype = parameter_dtype(module)
    if dtype not in HALF_DTYPES:
        return inputs
    found: list[Input] = []
    inputs = _map_inputs(inputs, dtype, found)
    if found:
        logger.info("%d inputs given without a dtype take the model's parameter dtype %s (as Torch-TensorRT infers "
                    "an unset input type)", len(found), dtype)
    return inputs
