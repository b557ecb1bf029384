"""`torchkiln.ts`: Torch-TensorRT's TorchScript frontend names, so a `torch_tensorrt.ts` script ports by
changing the import.

`TensorRTCompileSpec(**settings)` is a validated bundle of compile settings. Torch-TensorRT hands it to
`torch._C._jit_to_backend("tensorrt", module, {"forward": spec})`, a TorchScript backend registered from C++;
torchkiln registers no such backend, so give the spec (or that dict) to `torchkiln.ts.compile` instead:
`torchkiln.ts.compile(module, {"forward": spec})` returns what the backend call would.

`save` and `convert_method_to_trt_engine` are also top-level names (`torchkiln.save`), as in Torch-TensorRT.
docs/porting.md lists every Torch-TensorRT name and its torchkiln equivalent.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torchkiln import logging
from torchkiln.compiler import check_method_op_support, compile as _compile, convert_method_to_engine
from torchkiln.compiler import embed_engine_in_new_module
from torchkiln.device import Device
from torchkiln.settings import CompileSettings, Input

TorchScriptInput = Input  # Torch-TensorRT's name of the TorchScript frontend's Input
TorchScriptDevice = Device


class TensorRTCompileSpec:
    """Compile settings checked now (the same keywords as `compile`, with `inputs` or `input_signature`)."""

    def __init__(self, **settings: Any) -> None:
        options = dict(settings)
        inputs = options.pop("inputs", None)
        if "input_signature" in options:
            if inputs is not None:
                raise ValueError("give inputs or input_signature (another name for it), not both")
            inputs = options.pop("input_signature")
        known = {f.name for f in dataclasses.fields(CompileSettings)} - {"inputs", "input_signature"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"TensorRTCompileSpec: unknown compile settings {unknown}; known: {sorted(known)}")
        CompileSettings.create(inputs, **options)  # raises ValueError naming a bad setting
        self.settings = dict(settings)

    def __repr__(self) -> str:
        return f"TensorRTCompileSpec({', '.join(f'{k}={v!r}' for k, v in self.settings.items())})"


def _spec_settings(spec: Any) -> dict[str, Any]:
    if isinstance(spec, dict):
        methods = sorted(spec)
        if methods != ["forward"] or not isinstance(spec["forward"], TensorRTCompileSpec):
            raise ValueError(f"a method-to-spec dict must be {{'forward': TensorRTCompileSpec(...)}}, got "
                                 f"methods {methods}; torchkiln compiles forward only")
        spec = spec["forward"]
    return dict(spec.settings)


def compile(module: torch.nn.Module, inputs: Any = None, **settings: Any) -> torch.jit.ScriptModule:
    """`torchkiln.compile`; `inputs` may also be a TensorRTCompileSpec or `{"forward": spec}`, whose settings
    are then used (no other keywords with it)."""
    if isinstance(inputs, TensorRTCompileSpec) or (
            isinstance(inputs, dict) and any(isinstance(v, TensorRTCompileSpec) for v in inputs.values())):
        if settings:
            raise ValueError(f"give the settings in the TensorRTCompileSpec, not also as keywords {sorted(settings)}")
        settings = _spec_settings(inputs)
        inputs = settings.pop("inputs", None)
    return _compile(module, inputs, **settings)


def convert_method_to_trt_engine(module: torch.nn.Module, method_name: str = "forward",
                                 inputs: Sequence[Any] | None = None, arg_inputs: Sequence[Any] | None = None,
                                 ir: str = "default", enabled_precisions: Iterable[Any] | None = None,
                                 **settings: Any) -> bytes:
    """Torch-TensorRT's name of `torchkiln.convert_method_to_engine`: one method as serialized engine bytes."""
    return convert_method_to_engine(module, method_name, inputs, arg_inputs=arg_inputs, ir=ir,
                                    enabled_precisions=enabled_precisions, **settings)


SAVE_FORMATS = ("torchscript", "ts")


def save(module: torch.jit.ScriptModule, file_path: str | os.PathLike = "", *,
         output_format: str = "torchscript", extra_files: dict[str, str] | None = None,
         inputs: Sequence[Any] | None = None, arg_inputs: Sequence[Any] | None = None,
         kwarg_inputs: dict[str, Any] | None = None, retrace: bool = True) -> None:
    """Torch-TensorRT's `save` for a compiled module: `torch.jit.save` (read back with `torchkiln.load`).

    torchkiln compiles to TorchScript, so `output_format` is "torchscript" (or "ts"); the example inputs and
    `retrace` that other formats need are accepted and not used, as Torch-TensorRT does for TorchScript."""
    if output_format not in SAVE_FORMATS:
        raise ValueError(f"output_format={output_format!r}: torchkiln saves TorchScript; use "
                         f"output_format='torchscript' (Torch-TensorRT's exported_program, aot_inductor and "
                         f"executorch come from its dynamo frontend)")
    if not isinstance(module, torch.jit.ScriptModule):
        raise ValueError(f"save takes a compiled (TorchScript) module, got {type(module).__name__}; compile it "
                         f"with torchkiln.compile first")
    if not file_path:
        raise ValueError("save needs a file_path")
    torch.jit.save(module, file_path, _extra_files=dict(extra_files or {}))


__all__ = ["TensorRTCompileSpec", "TorchScriptDevice", "TorchScriptInput", "check_method_op_support", "compile",
           "convert_method_to_trt_engine", "embed_engine_in_new_module", "logging"]
