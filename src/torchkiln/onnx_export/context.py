"""The export context: the ONNX graph being built, dtype mapping, and the casts around ORT's CPU kernels.

ONNX Runtime's CPU provider registers each op for some element types only. `ExportContext.op` runs an op
in the dtype asked for where a kernel exists, else in the narrowest wider dtype that has one (exact: the
inputs widen without loss and the result is cast back), else declines with an OnnxExportError.

Symbolic dims (dynamic shapes): `ExportContext.dim` gives the int64 [1] value of a dim at run time. Each symbol
is read off a network input dim that is that symbol (Shape with start/end, once per symbol); an expression
becomes int64 arithmetic over them following `ir.symbolic.to_tree` (floor division and Python's modulus exactly),
each distinct subexpression computed once.
"""
from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from torchkiln.errors import TorchkilnError
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network, unique_name
from torchkiln.ir.symbolic import Dim, DimSymbol, SymbolicError, bounds, decide, dim_str, from_tree, is_symbolic, \
    to_tree
from torchkiln.ir.tensor import Tensor


class OnnxExportError(TorchkilnError):
    """A layer (kind, parameter or dtype) has no exact ONNX form that ONNX Runtime's CPU provider runs."""


CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's own ops (`network_to_onnx(contrib_ops=True)`)

ONNX_DTYPES: dict[torch.dtype, int] = {
    torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE, torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16, torch.int8: TensorProto.INT8, torch.int16: TensorProto.INT16,
    torch.int32: TensorProto.INT32, torch.int64: TensorProto.INT64, torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL, torch.float8_e4m3fn: TensorProto.FLOAT8E4M3FN,
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
    "NonZero": frozenset({_F32, _F16, _I32, _I64, _U8, _B}),
    "Unique": frozenset({_F32, _F16, _F64, _I8, _I64}),
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
    if value.dtype == torch.float8_e4m3fn:
        raw = value.view(torch.uint8).numpy().tobytes()
        return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(value.shape), raw, raw=True)
    return numpy_helper.from_array(value.numpy(), name)


def never_empty(shape: Sequence[Dim]) -> bool:
    """Whether no dim of `shape` can be 0 (symbolic dims by their bounds)."""
    return all(decide("eq", d, 0) is False for d in shape)


def value_info(name: str, dtype: torch.dtype, shape: Sequence[int]) -> onnx.ValueInfoProto:
    """A typed graph input or output; a symbolic dim becomes a dim_param named by its expression (`s0`)."""
    dims = [d if isinstance(d, int) else dim_str(d) for d in shape]
    return helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], dims)


class ExportContext:
    """The nodes and initializers of the graph being built, and the layer being exported (named by errors)."""

    def __init__(self, opset: int, guarded: bool = False) -> None:
        self.opset = opset
        self.guarded = guarded  # the model will have the guard output (`guard_flag`): `exact_below` is honoured
        self._subgraphs = 0  # how deep in subgraphs the nodes being made are (`subgraph_scope`)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.used: set[str] = set()
        self.layer: L.Layer | None = None
        # Where each symbol is read at run time: (input name, dim); None: any symbol is a placeholder input
        # (checking one layer alone, `supports`).
        self.symbol_sources: dict[DimSymbol, tuple[str, int]] | None = None
        self._dims: dict[str, str] = {}  # a dim's tree (JSON) -> its int64 [1] value
        # Tensors the exported ops match the meanings for only while every |value| < bound (see `exact_below`).
        # (the layer, x, its dtype and shape, the bound)
        self.guards: list[tuple[L.Layer | None, str, torch.dtype, tuple[Dim, ...], float]] = []
        # Tensors whose exported ops are exact to their largest value only while it is at least a bound
        # (`exact_while_largest_at_least`): (the layer, y, its dtype and shape, the bound)
        self.floors: list[tuple[L.Layer | None, str, torch.dtype, tuple[Dim, ...], float]] = []
        # Tensors (ids) of int8 quantize layers, and with unsigned weights of int8 constants, exported as uint8 (value
        # + 128, `unsigned_quantized`, `ir.quantization.dequantized_constants`); with `unsigned_weights`, quantized kernels too
        self.unsigned: set[int] = set()
        self.unsigned_weights = False
        # With contrib ops (ONNX Runtime's sessions): the matrix multiplies (ids) exported as MatMulIntegerToFloat, and
        # the dequantize layers' outputs (ids) that pass their integer input to them (`integer_matrix_multiplies`)
        self.integer_matmuls: set[int] = set()
        self.integer_inputs: set[int] = set()
        # -inf paddings (ids) that max pools read alone, and those pools' ONNX pads with them folded in
        # (`pads_into_max_pools`)
        self.folded_pads: set[int] = set()
        self.pool_pads: dict[int, list[int]] = {}

    def read_symbols(self, network: Network) -> None:
        """Take each of the network's symbols from the first input dim that is that symbol."""
        self.symbol_sources = {}
        for t in network.inputs:
            for d, s in enumerate(t.shape):
                if isinstance(s, DimSymbol):
                    self.symbol_sources.setdefault(s, (t.name, d))

    def define_symbol(self, s: DimSymbol, name: str, dim: int) -> None:
        """A data-dependent layer's symbol is read off its output `name` at `dim` by the layers after it."""
        if self.symbol_sources is not None:
            self.symbol_sources[s] = (name, dim)

    # ---- errors ---------------------------------------------------------------------------
    def decline(self, reason: str) -> NoReturn:
        """Raise OnnxExportError naming the current layer, its kind and `reason` (which names the param)."""
        layer = self.layer
        where = f"{layer.KIND} layer {layer.name!r}" if layer is not None else "network"
        raise OnnxExportError(f"{where}: {reason}; run it on the reference backend instead")

    # ---- exact only for some values --------------------------------------------------------
    def exact_below(self, x: str, dtype: torch.dtype, shape: Sequence[Dim], bound: float = math.inf) -> None:
        """Record that the current layer's ONNX form computes its meaning only while every |x| < `bound` (NaN and
        inf never are): a backend can ask the model to say when a call breaks that (`guard_flag`)."""
        self.guards.append((self.layer, x, dtype, tuple(shape), bound))

    @property
    def guard_reachable(self) -> bool:
        """Whether a guard recorded now reaches the model's guard output: the model has one, and the nodes being
        made are not a subgraph's (an If or Loop body, whose values the guard cannot read)."""
        return self.guarded and self._subgraphs == 0

    def exact_while_largest_at_least(self, y: str, dtype: torch.dtype, shape: Sequence[Dim], bound: float) -> None:
        """Record that the current layer's ONNX form gives its output `y` within a small absolute error (not a
        relative one), so that it is exact to y's scale only while y's largest value is at least `bound`: a backend can
        ask the model to say when a call may break that (`guard_flag`). The guard tests a sample of y
        (`_sample_largest`), whose largest value is at most the whole's: a call is flagged where the sample's is under
        the bound, whatever the rest holds. `shape`: y's, of rank 1 or more and no dim that may be 0."""
        if not shape or not never_empty(shape):
            raise ValueError(f"a floor guard needs a tensor of rank 1 or more and no empty dim, not {list(shape)}")
        self.floors.append((self.layer, y, dtype, tuple(shape), bound))

    def guard_flag(self) -> str:
        """A bool [] that is true when some tensor recorded by `exact_below` has a value outside its bound, or one
        recorded by `exact_while_largest_at_least` has a sample whose largest value is under its bound (the samples'
        largest values of one dtype and bound joined by one Min, so that one Less tests them; each check's nodes named
        after the layer that recorded it; the nodes joining checks after the last of them, so that a profile gives
        every node a layer). Float32 and float64 tensors without a bound are summed, and the sums of each dtype
        added, so that one IsNaN and one IsInf test them all."""
        flags, sums = [], {}
        for layer, x, dtype, shape, bound in self.guards:
            self.layer = layer
            if bound == math.inf and dtype in (torch.float32, torch.float64):
                sums.setdefault(dtype, []).append(self._sum(x, dtype, shape))
            else:
                flags.append(self._outside(x, dtype, bound))
        floors: dict[tuple[torch.dtype, float], list[str]] = {}
        for layer, y, dtype, shape, bound in self.floors:
            self.layer = layer
            floors.setdefault((dtype, bound), []).append(self._sample_largest(y, dtype, shape))
        for (dtype, bound), largest in floors.items():
            least = largest[0] if len(largest) == 1 else self.op("Min", largest, dtype)
            flags.append(self.op("Less", [least, self.scalar(bound, dtype)], dtype, typed_outputs=()))
        for dtype, totals in sums.items():
            total = totals[0] if len(totals) == 1 else self.op("Sum", totals, dtype)
            flags.append(self.node("Or", [self.op("IsNaN", [total], dtype, typed_outputs=()),
                                          self.op("IsInf", [total], dtype, typed_outputs=())])[0])
        flag = flags[0]
        for other in flags[1:]:
            flag = self.node("Or", [flag, other])[0]
        self.layer = None
        return flag

    def _outside(self, x: str, dtype: torch.dtype, bound: float) -> str:
        """Whether some |x| >= bound (NaN never is below it); a bool []."""
        inside = self.op("Less", [self.op("Abs", [x], dtype), self.scalar(bound, dtype)], dtype, typed_outputs=())
        return self.node("Not", [self.op("ReduceMin", [inside], torch.bool, keepdims=0)])[0]

    def _sample_largest(self, y: str, dtype: torch.dtype, shape: tuple[Dim, ...]) -> str:
        """The largest value of a sample of y, a []: the first index of its second-to-last dim (the first row of every
        channel of an image, the first token's features of a sequence), or all of a vector. A float32 image with static
        rows and columns is sampled by a max pooling of window [1, W] and stride [H, W], which ORT runs in the NCHWc
        layout of the convolutions around it, where a Slice would have the whole tensor reordered first. (A pass over
        each whole guarded tensor, by GlobalMaxPool, cost 15% of a call of a SiLU network at batch 1; a Slice, or an If
        around that pass where the sample fails, cost as much.)"""
        if dtype == torch.float32 and len(shape) == 4 and all(isinstance(d, int) for d in shape[2:]):
            sample = self.node("MaxPool", [y], kernel_shape=[1, shape[3]], strides=list(shape[2:]))[0]
        elif len(shape) >= 2:
            sample = self.node("Slice", [y, self.ints([0]), self.ints([1]), self.ints([len(shape) - 2])])[0]
        else:
            sample = y
        return self.op("ReduceMax", [sample], dtype, keepdims=0)

    def _sum(self, x: str, dtype: torch.dtype, shape: tuple[Dim, ...]) -> str:
        """x's sum, a float32 or float64 []: NaN or +-inf where x holds a NaN or an inf, whatever the order of the
        additions (and where finite values overflow, the call is computed otherwise for nothing). A float32 tensor of
        rank 3 or more is summed per channel by GlobalAveragePool first: ORT runs it in the NCHWc layout of the
        convolutions around it, where a ReduceSum of the whole tensor needs it reordered (ORT's GlobalAveragePool
        refuses an empty dim but the first)."""
        if dtype == torch.float32 and len(shape) >= 3 and never_empty(shape[1:]):
            x = self.node("GlobalAveragePool", [x])[0]
        return self.op("ReduceSum", [x], dtype, keepdims=0)

    # ---- names, constants, nodes ----------------------------------------------------------
    def fresh(self, base: str) -> str:
        return unique_name(base, self.used)

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

    def branch(self, condition: str, dtype: torch.dtype, then: Callable[[], str], otherwise: str) -> str:
        """An If node: `then()`'s result (its nodes built into the branch, computed only when the bool []
        `condition` is true), else `otherwise` (a tensor of `dtype` computed before)."""
        outer, self.nodes = self.nodes, []
        result = then()
        then_nodes, self.nodes = self.nodes, outer
        passed = self.fresh(f"{otherwise}/unchanged")
        branches = {}
        for key, nodes, name in (("then_branch", then_nodes, result),
                                 ("else_branch", [helper.make_node("Identity", [otherwise], [passed])], passed)):
            info = helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], None)
            branches[key] = helper.make_graph(nodes, self.fresh(key), [], [info])
        return self.node("If", [condition], **branches)[0]

    @contextlib.contextmanager
    def subgraph_scope(self) -> Iterator[list[onnx.NodeProto]]:
        """Append nodes to a new list (a subgraph's) meanwhile, where no dim computed outside is visible; the
        current layer and the outer nodes come back after."""
        saved = self.nodes, self._dims, self.layer
        self.nodes, self._dims = [], {}
        self._subgraphs += 1
        try:
            yield self.nodes
        finally:
            self.nodes, self._dims, self.layer = saved
            self._subgraphs -= 1

    # ---- dims computed at run time ---------------------------------------------------------
    def dim(self, d: Dim) -> str:
        """The int64 [1] value of a dim (an int or a symbolic expression) at run time."""
        if not is_symbolic(d):
            return self.ints([int(d)], "dim")
        try:
            tree = to_tree(d)
        except SymbolicError as e:
            self.decline(f"symbolic dim {dim_str(d)} has no integer form: {e}")
        names = {s.name: s for s in d.free_symbols}
        if len(names) != len(d.free_symbols):
            self.decline(f"symbolic dim {dim_str(d)} uses two symbols of one name")
        return self._tree_value(tree, names)

    def dim_scalar(self, d: Dim) -> str:
        """The 0-d int64 value of a dim at run time."""
        if not is_symbolic(d):
            return self.constant(torch.tensor(int(d)), "dim")
        return self.node("Squeeze", [self.dim(d), self.ints([0], "axes")])[0]

    def shape_tensor(self, dims: Sequence[Dim], base: str = "shape") -> str:
        """A 1-d int64 tensor of dims (a constant when none is symbolic, else a Concat of their values)."""
        if not any(is_symbolic(d) for d in dims):
            return self.ints([int(d) for d in dims], base)
        parts: list[str] = []
        run: list[int] = []  # consecutive ints become one constant
        for d in dims:
            if is_symbolic(d):
                if run:
                    parts.append(self.ints(run, base))
                    run = []
                parts.append(self.dim(d))
            else:
                run.append(int(d))
        if run:
            parts.append(self.ints(run, base))
        return parts[0] if len(parts) == 1 else self.node("Concat", parts, axis=0)[0]

    def _symbol_value(self, s: DimSymbol) -> str:
        if self.symbol_sources is None:
            return self.fresh(f"symbol/{s.name}")
        source = self.symbol_sources.get(s)
        if source is None:
            self.decline(f"symbol {s.name} is no dim of a network input, so its value is unknown here")
        name, d = source
        return self.node("Shape", [name], start=d, end=d + 1)[0]

    def _tree_value(self, tree: Any, symbols: dict[str, DimSymbol]) -> str:
        key = json.dumps(tree, sort_keys=True)
        found = self._dims.get(key)
        if found is not None:
            return found
        if isinstance(tree, int):
            value = self.ints([tree], "dim")
        elif tree["op"] == "sym":
            value = self._symbol_value(symbols[tree["name"]])
        else:
            args = [self._tree_value(a, symbols) for a in tree["args"]]
            op = tree["op"]
            if op in ("add", "mul"):
                value = args[0]
                for a in args[1:]:
                    value = self.node("Add" if op == "add" else "Mul", [value, a])[0]
            elif op in ("max", "min"):
                value = self.node("Max" if op == "max" else "Min", args)[0]
            elif op == "mod":  # ONNX's integer Mod (fmod=0) takes the divisor's sign, as Python's % does
                value = self.node("Mod", args)[0]
            else:
                value = self._floordiv(*args, *(from_tree(a, symbols) for a in tree["args"]))
        self._dims[key] = value
        return value

    def _floordiv(self, a: str, b: str, da: Dim, db: Dim) -> str:
        """Python's a // b: ONNX's integer Div truncates, so where the ranges do not show a >= 0 and b > 0 the
        quotient steps down by one when the remainder is nonzero and its sign differs from b's."""
        q = self.node("Div", [a, b])[0]
        if bounds(da)[0] >= 0 and bounds(db)[0] > 0:
            return q
        r = self.node("Sub", [a, self.node("Mul", [q, b])[0]])[0]
        zero = self.ints([0], "zero")
        nonzero = self.node("Not", [self.node("Equal", [r, zero])[0]])[0]
        signs = self.node("Xor", [self.node("Less", [r, zero])[0], self.node("Less", [b, zero])[0]])[0]
        step = self.node("Cast", [self.node("And", [nonzero, signs])[0]], to=TensorProto.INT64)[0]
        return self.node("Sub", [q, step])[0]

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
