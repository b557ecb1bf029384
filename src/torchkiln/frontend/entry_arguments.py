"""Arguments every compile entry point takes besides the settings, with Torch-TensorRT's names: `ir` (which
frontend compiles) and `arg_inputs` (another name for `inputs`)."""
from __future__ import annotations

from typing import Any

# Torch-TensorRT's `ir` values that mean its TorchScript frontend; "default" picks it for torchkiln.
TORCHSCRIPT_IRS = ("default", "ts", "torchscript")


def check_ir(ir: Any) -> None:
    """Raise ValueError naming `ir` unless it is one of TORCHSCRIPT_IRS."""
    if ir not in TORCHSCRIPT_IRS:
        raise ValueError(f"ir={ir!r}: torchkiln compiles TorchScript; use ir='ts' or ir='default' (Torch-TensorRT's "
                         f"dynamo, torch_compile and fx frontends have no torchkiln equivalent)")


def take_entry_arguments(inputs: Any, options: dict[str, Any]) -> Any:
    """Check and remove `ir` and `arg_inputs` from `options`; the inputs (`arg_inputs` when given instead)."""
    check_ir(options.pop("ir", "default"))
    if "arg_inputs" in options:
        arg_inputs = options.pop("arg_inputs")
        if inputs is not None and arg_inputs is not None:
            raise ValueError("give inputs or arg_inputs (another name for it), not both")
        inputs = arg_inputs if arg_inputs is not None else inputs
    return inputs
