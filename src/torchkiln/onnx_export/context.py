"""The export context: the ONNX graph being built, dtype mapping, and the casts around ORT's CPU kernels.

ONNX Runtime's CPU provider registers each op for some element types only. `ExportContext.op` runs an op
in the dtype asked for where a kernel exists, else in the narrowest wider dtype that has one (exact: the
inputs widen without loss and the result is cast back), else declines with an OnnxExportError.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from torchkiln.errors import TorchkilnError
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import dim_str
from torchkiln.ir.tensor import Tensor


class OnnxExportError(TorchkilnError):
    """A layer (kind, parameter or dtype) has no exact ONNX form that ONNX Runtime's CPU provider runs."""


ONNX_DTYPES: dict[torch.dtype, int] = {
    torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE, torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16, torch.int8: TensorProto.INT8, torch.int16: TensorProto.INT16,
    torch.int32: TensorProto.INT32, torch.int64: TensorProto.INT64, torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}

_F32, _F64, _F16, _BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
_I8, _I16, _I32, _I64, _U8, _B = torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool
_FLOATS = frozenset({_F32, _F64, _F16})  # float16 runs through ORT's own fp32 fallback where it has no kernel
_SINGLE = frozenset({_F32, _F16})
_INTS = frozenset({_I8, _I16, _I32, _I64, _U8})
_ALL = frozenset(ONNX_DTYPES)

# Element types ONNX Runtime's (1.32) CPU provider has kernels for, per op; ops not listed take every type.
KERNEL_DTYPES: dict[str, frozenset[torch.dtype]] = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Mod", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                     "Abs"), _FLOATS | _INTS),
    "Equal": _FLOATS | _INTS | {_B},
    "Pow": _FLOATS | {_I32, _I64},
    **dict.fromkeys(("Max", "Min", "Where"), _FLOATS | {_I8, _I32, _I64, _U8}),
    **dict.fromkeys(("And", "Or", "Xor", "Not"), frozenset({_B})),
    **dict.fromkeys(("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"), _INTS),
    "Neg": _FLOATS | {_I8, _I16, _I32, _I64},
    "Sign": _FLOATS | _INTS | {_BF16},
    **dict.fromkeys(("Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Ceil", "Floor", "Round", "Sigmoid",
                     "Tanh", "Softmax", "LogSoftmax", "GroupNormalization", "GridSample", "Attention"), _FLOATS),
    **dict.fromkeys(("Tan", "Sinh", "Cosh", "Asin", "Acos", "Atan", "Asinh", "Acosh", "Atanh", "Erf",
                     "LeakyRelu", "Elu", "Selu", "Softsign", "Softplus", "HardSigmoid", "HardSwish", "Gelu",
                     "Mish", "PRelu", "AveragePool", "Conv", "ConvTranspose", "InstanceNormalization"), _SINGLE),
    "Celu": frozenset({_F32}),
    **dict.fromkeys(("IsInf", "IsNaN"), _FLOATS | {_BF16}),
    "Relu": _FLOATS | {_I8, _I32},
    **dict.fromkeys(("MatMul", "CumSum", "ReduceSum", "ReduceMean", "ReduceProd", "Einsum"), _FLOATS | {_I32, _I64}),
    **dict.fromkeys(("ReduceMax", "ReduceMin"), _FLOATS | {_I8, _I32, _I64, _U8, _B}),
    "Clip": _FLOATS | _INTS | {_BF16},
    "Pad": _ALL - {_I16},
    "Expand": _ALL - {_BF16},
    "MaxPool": _FLOATS | {_I8, _U8},
    "LayerNormalization": _FLOATS | {_BF16},
    "Resize": frozenset({_F32, _F16, _I8, _I32, _U8}),
    "TopK": _FLOATS | _INTS,
}

# Where a dtype has no kernel, the wider dtypes that hold every value of it, narrowest first.
WIDER: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    _BF16: (_F32,), _F16: (_F32,), _I8: (_I16, _I32, _I64), _U8: (_I16, _I32, _I64), _I16: (_I32, _I64),
    _I32: (_I64,), _B: (_U8, _I32, _I64),
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_proto(value: torch.Tensor, name: str) -> TensorProto:
    """An initializer holding `value` (bfloat16 as raw bits, which numpy cannot hold)."""
    value = value.detach().cpu().contiguous()
    if value.dtype == torch.bfloat16:
        raw = value.view(torch.int16).numpy().tobytes()
        return helper.make_tensor(name, TensorProto.BFLOAT16, list(value.shape), raw, raw=True)
    return numpy_helper.from_array(value.numpy(), name)


def value_info(name: str, dtype: torch.dtype, shape: Sequence[int]) -> onnx.ValueInfoProto:
    """A typed graph input or output; a symbolic dim becomes a dim_param named by its expression (`s0`)."""
    dims = [d if isinstance(d, int) else dim_str(d) for d in shape]
    return helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], dims)


class ExportContext:
    """The nodes and initializers of the graph being built, and the layer being exported (named by errors)."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.used: set[str] = set()
        self.layer: L.Layer | None = None

    # ---- errors ---------------------------------------------------------------------------
    def decline(self, reason: str) -> NoReturn:
        """Raise OnnxExportError naming the current layer, its kind and `reason` (which names the param)."""
        layer = self.layer
        where = f"{layer.KIND} layer {layer.name!r}" if layer is not None else "network"
        raise OnnxExportError(f"{where}: {reason}; run it on the reference backend instead")

    # ---- names, constants, nodes ----------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name

    def constant(self, value: torch.Tensor | np.ndarray, base: str = "const") -> str:
        """An initializer; returns its name."""
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        prefix = self.layer.name if self.layer is not None else "graph"
        name = self.fresh(f"{prefix}/{base}")
        self.initializers.append(tensor_proto(value, name))
        return name

    def ints(self, values: Sequence[int], base: str = "ints") -> str:
        """A 1-d int64 initializer (shapes, axes, pads)."""
        return self.constant(torch.tensor(list(values), dtype=torch.int64), base)

    def scalar(self, value: float | bool, dtype: torch.dtype) -> str:
        """A 0-d initializer of `dtype` (values cast as torch casts them)."""
        return self.constant(torch.tensor(value, dtype=torch.float64 if dtype.is_floating_point else None)
                             .to(dtype), "scalar")

    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs: object) -> list[str]:
        """Append one node; returns its output names."""
        prefix = self.layer.name if self.layer is not None else "graph"
        names = [self.fresh(f"{prefix}/{op_type}:{i}") for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.fresh(f"{prefix}/{op_type}"),
                                           **attrs))
        return names

    def cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        if src == dst:
            return x
        return self.node("Cast", [x], to=ONNX_DTYPES[dst])[0]

    # ---- ops in a dtype ORT's CPU provider runs ---------------------------------------------
    def compute_dtype(self, op_type: str, dtype: torch.dtype) -> torch.dtype:
        """`dtype` if ORT's CPU provider has an `op_type` kernel for it, else the narrowest wider one that has."""
        allowed = KERNEL_DTYPES.get(op_type, _ALL)
        if dtype in allowed:
            return dtype
        for wider in WIDER.get(dtype, ()):
            if wider in allowed:
                return wider
        self.decline(f"ONNX Runtime's CPU provider has no {op_type} kernel for {dtype_name(dtype)} "
                     f"(nor for a wider type that holds it exactly)")

    def op(self, op_type: str, inputs: Sequence[str], dtype: torch.dtype, *, typed: Sequence[int] | None = None,
           outputs: int = 1, typed_outputs: Sequence[int] | None = None, **attrs: object) -> str | list[str]:
        """`op_type` on `inputs` (those at `typed` indices of `dtype`) computed exactly in `dtype`, widening where
        ORT lacks the kernel; results at `typed_outputs` come back in `dtype`. One output: its name; else a list."""
        compute = self.compute_dtype(op_type, dtype)
        typed = range(len(inputs)) if typed is None else typed
        ins = [self.cast(x, dtype, compute) if i in typed and x else x for i, x in enumerate(inputs)]
        outs = self.node(op_type, ins, outputs, **attrs)
        typed_outputs = range(outputs) if typed_outputs is None else typed_outputs
        outs = [self.cast(o, compute, dtype) if i in typed_outputs else o for i, o in enumerate(outs)]
        return outs[0] if outputs == 1 else outs


Exporter = Callable[[ExportContext, L.Layer, list[str]], "str | list[str]"]
EXPORTERS: dict[type[L.Layer], Exporter] = {}


def exporter(kind: type[L.Layer]) -> Callable[[Exporter], Exporter]:
    """Register the function that emits ONNX nodes for one layer kind (it declines with ctx.decline)."""
    def register(fn: Exporter) -> Exporter:
        if kind in EXPORTERS:
            raise ValueError(f"ONNX exporter for {kind.KIND!r} registered twice")
        EXPORTERS[kind] = fn
        return fn

    return register


def promoted(a: Tensor, b: Tensor) -> torch.dtype:
    """The dtype torch computes a binary op of network tensors `a` and `b` in (0-d operands promote less)."""
    def meta(t):
        return torch.empty([1] * t.rank, dtype=t.dtype, device="meta")  # only 0-d or not matters

    return torch.result_type(meta(a), meta(b))
