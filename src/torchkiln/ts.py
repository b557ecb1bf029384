"""`torchkiln.ts`: Torch-TensorRT's TorchScript frontend names, so a `torch_tensorrt.ts` script ports by
changing the import.

`TensorRTCompileSpec(**settings)` is a validated bundle of compile settings. Torch-TensorRT hands it to
`torch._C._jit_to_backend("tensorrt", module, {"forward": spec})`, a TorchScript backend registered from C++;
torchkiln registers no such backend, so give the spec (or that dict) to `torchkiln.ts.compile` instead:
`torchkiln.ts.compile(module, {"forward": spec})` returns what the backend call would.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.compiler import check_method_op_support, compile as _compile, convert_method_to_engine
from torchkiln.compiler import embed_engine_in_new_module
from torchkiln.settings import CompileSettings


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
                                 inputs: Sequence[Any] | None = None, **settings: Any) -> bytes:
    """Torch-TensorRT's name of `torchkiln.convert_method_to_engine`: one method as serialized engine bytes."""
    return convert_method_to_engine(module, method_name, inputs, **settings)


__all__ = ["TensorRTCompileSpec", "check_method_op_support", "compile", "convert_method_to_trt_engine",
           "embed_engine_in_new_module"]
