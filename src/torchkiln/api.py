"""The public API, every name `import torchkiln` gives; importing it imports torch and registers torchkiln's
TorchScript ops (torch.ops.torchkiln.execute_engine, which torch.jit.load of a compiled module needs)."""
from torchkiln._version import __version__
from torchkiln.compiler import (
    check_method_op_support,
    compile,
    convert_method_to_engine,
    embed_engine_in_new_module,
    partition_report,
    unsupported_ops,
)
from torchkiln.conversion import supported_ops
from torchkiln.build_info import dump_build_info, set_device
from torchkiln.device import Device
from torchkiln.enums import DeviceType, EngineCapability, dtype, memory_format
from torchkiln.debug_precision import PrecisionReport, debug_precision
from torchkiln.lowering.passes.replace_python_ops import register_python_op
from torchkiln.errors import (
    ConversionError,
    EngineFormatError,
    EngineIndexError,
    EngineInputError,
    TorchkilnError,
    RefitError,
    TracingError,
    TracingWarning,
    UnsupportedOperatorError,
)
from torchkiln import ops as _ops  # noqa: F401  (defines torch.ops.torchkiln.const and attn_bias_from_attn_mask)
from torchkiln.runtime import execute_op as _execute_op  # noqa: F401  (registers torch.ops.torchkiln.execute_engine)
from torchkiln.onnx_file import export_onnx
from torchkiln.refit import refit_module_weights
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.native import runtime_library_path
from torchkiln.settings import Input
from torchkiln.stitching.module import load
from torchkiln.ts import convert_method_to_trt_engine, save
from torchkiln import logging, ptq, ts  # noqa: E402  (Torch-TensorRT's torch_tensorrt.logging, .ptq and .ts)

__all__ = [
    "ConversionError", "Device", "DeviceType", "Engine", "EngineCapability", "EngineFormatError", "EngineIndexError",
    "EngineInputError", "Input", "PrecisionReport", "RefitError", "TorchkilnError", "TracingError", "TracingWarning",
    "UnsupportedOperatorError", "__version__", "check_method_op_support", "compile", "convert_method_to_engine",
    "convert_method_to_trt_engine", "debug_precision", "dtype", "dump_build_info", "embed_engine_in_new_module",
    "export_onnx", "load", "logging", "memory_format", "partition_report", "refit_module_weights",
    "ptq", "register_python_op", "runtime_library_path", "save", "set_device", "supported_ops", "ts",
    "unsupported_ops",
]
