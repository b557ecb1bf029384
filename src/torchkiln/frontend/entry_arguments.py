"""Arguments every compile entry point takes besides the settings, with Torch-TensorRT's names: `ir` (which
frontend compiles) and `arg_inputs` (another name for `inputs`); and Torch-TensorRT's INT8 post-training
quantization (`calibrator=`, int8 in `enabled_precisions`), refused by name until torchkiln quantizes."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

# Torch-TensorRT's `ir` values that mean its TorchScript frontend; "default" picks it for torchkiln.
TORCHSCRIPT_IRS = ("default", "ts", "torchscript")


def check_ir(ir: Any) -> None:
    """Raise ValueError naming `ir` unless it is one of TORCHSCRIPT_IRS."""
    if ir not in TORCHSCRIPT_IRS:
        raise ValueError(f"ir={ir!r}: torchkiln compiles TorchScript; use ir='ts' or ir='default' (Torch-TensorRT's "
                         f"dynamo, torch_compile and fx frontends have no torchkiln equivalent)")


def _refuse_int8(options: dict[str, Any]) -> None:
    precisions = options.get("enabled_precisions")
    precisions = [precisions] if not isinstance(precisions, Iterable) or isinstance(precisions, str) else precisions
    int8 = [p for p in precisions if p is torch.int8 or getattr(p, "value", None) == "i8"
            or (isinstance(p, str) and p.lower() in ("int8", "i8"))]
    if "calibrator" in options or int8:
        what = "calibrator" if "calibrator" in options else f"enabled_precisions {int8[0]!r}"
        raise ValueError(f"{what}: INT8 post-training quantization (Torch-TensorRT's ptq calibrators) is not "
                         f"supported by torchkiln yet; compile in float32, float16 or bfloat16")


def take_entry_arguments(inputs: Any, options: dict[str, Any]) -> Any:
    """Check and remove `ir` and `arg_inputs` from `options`; the inputs (`arg_inputs` when given instead).
    Refuse INT8 quantization by name."""
    check_ir(options.pop("ir", "default"))
    _refuse_int8(options)
    if "arg_inputs" in options:
        arg_inputs = options.pop("arg_inputs")
        if inputs is not None and arg_inputs is not None:
            raise ValueError("give inputs or arg_inputs (another name for it), not both")
        inputs = arg_inputs if arg_inputs is not None else inputs
    return inputs
