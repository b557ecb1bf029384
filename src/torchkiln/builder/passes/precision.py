"""Run float layers in the engine's low precision (fp16/bf16) where that is safe, and in fp32 where the
model or the numerics need it; network inputs and outputs keep their declared dtypes.

The pass walks the layers in order and gives every float32 value one of three roles:

- FREE: fp32 whose precision the builder may choose: a network input, a constant, a value computed from
  no float input (an int cast to float), and the result of a layer computed in fp32 by rule whose values
  stay in fp16's range (softmax, a normalization, a mean). Each reader takes it in the precision it
  computes in; the narrowed copy is made once (a constant at build time, anything else by a cast).
- RULE: fp32 by rule, from a layer whose result may leave fp16's range (a sum, a product, exp, a power).
  Layers computing on it stay in fp32, as under torch.autocast, until a compute-bound layer (convolution,
  matrix multiply, einsum, attention) narrows it.
- MODEL: fp32 because the model cast a 16-bit float to fp32 (`x.float()` in a half model). It and every
  value computed from it stay fp32, compute-bound layers included, as eager computes them, until the
  model casts back. A cast from an int or bool to fp32 makes the model's ordinary float, not such a
  request: in an fp32 model every float is fp32 and `.float()` converts to no cast at all.

A conditional or loop layer reads its inputs in the dtypes its sub-networks were converted in (they are not
lowered). Which layers compute in fp32 whatever their inputs is one table, `_policy`; besides it, the layers named in
`BuildSettings.keep_fp32` (found by calibration to overflow or lose precision, builder/calibration.py) compute
in fp32 and their results are RULE, as a sum's are.
"""
from __future__ import annotations

import enum

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.shape_inference import infer_outputs
from torchkiln.ir.tensor import Tensor

F32 = torch.float32
HALF = (torch.float16, torch.bfloat16)


class Policy(enum.Enum):
    LOW = "low"  # compute-bound: runs in the low precision (fp32 only inside a MODEL region)
    FP32_NORMALIZED = "fp32_normalized"  # fp32 compute; the result is normalized (in fp16's range): FREE
    FP32_INPUT_RANGE = "fp32_input_range"  # fp32 compute; the result stays in its inputs' range (a mean)
    FP32_WIDE = "fp32_wide"  # fp32 compute; the result may leave fp16's range: RULE
    FOLLOW = "follow"  # the widest precision among its float inputs
    AS_IS = "as_is"  # reads its input in whatever precision it has (a cast, a shape)


class Role(enum.Enum):
    FREE = "free"
    RULE = "rule"
    MODEL = "model"


_BY_KIND: dict[type[L.Layer], Policy] = {
    L.ConvolutionLayer: Policy.LOW,
    L.MatrixMultiplyLayer: Policy.LOW,
    L.EinsumLayer: Policy.LOW,
    L.AttentionLayer: Policy.LOW,
    L.SoftMaxLayer: Policy.FP32_NORMALIZED,  # exp and a sum over the axis
    L.NormalizationLayer: Policy.FP32_NORMALIZED,  # mean and variance: x**2 leaves fp16's range past 256
    L.CumulativeLayer: Policy.FP32_WIDE,  # a running sum or product
    L.CastLayer: Policy.AS_IS,
    L.ShapeLayer: Policy.AS_IS,
    L.QuantizeLayer: Policy.AS_IS,  # its scales are float32 whatever it reads
    L.DequantizeLayer: Policy.AS_IS,
}
_REDUCE = {L.ReduceOperation.SUM: Policy.FP32_WIDE, L.ReduceOperation.PROD: Policy.FP32_WIDE,
           L.ReduceOperation.AVG: Policy.FP32_INPUT_RANGE}  # max, min, any, all are exact in any precision
_UNARY = {L.UnaryOperation.EXP: Policy.FP32_WIDE, L.UnaryOperation.EXPM1: Policy.FP32_WIDE,
          L.UnaryOperation.SQUARE: Policy.FP32_WIDE}
_ELEMENTWISE = {L.ElementWiseOperation.POW: Policy.FP32_WIDE}
_FP32 = (Policy.FP32_NORMALIZED, Policy.FP32_INPUT_RANGE, Policy.FP32_WIDE)


def _policy(layer: L.Layer) -> Policy:
    """How the low-precision pass runs this layer: the one table of fp32-by-rule layers; a quantized layer (one
    reading a dequantized value, or a convolution with a quantized kernel) computes on its exact float32 values."""
    if getattr(layer, "kernel_type", None) is not None \
            or any(isinstance(t.producer, L.DequantizeLayer) for t in layer.inputs):
        return Policy.FP32_NORMALIZED
    if isinstance(layer, L.ReduceLayer):
        return _REDUCE.get(layer.op, Policy.FOLLOW)
    if isinstance(layer, L.UnaryLayer):
        return _UNARY.get(layer.op, Policy.FOLLOW)
    if isinstance(layer, L.ElementWiseLayer):
        return _ELEMENTWISE.get(layer.op, Policy.FOLLOW)
    return _BY_KIND.get(type(layer), Policy.FOLLOW)


class _Lowering:
    """One run of the pass: the role of every fp32 tensor, and the copies made in another precision."""

    def __init__(self, network: Network, low: torch.dtype, keep_fp32: frozenset[str] = frozenset()) -> None:
        self.network = network
        self.low = low
        self.keep_fp32 = keep_fp32
        self.roles: dict[int, Role] = {id(t): Role.FREE for t in network.inputs if t.dtype == F32}
        self.copies: dict[tuple[int, torch.dtype], Tensor] = {}
        self.order: list[L.Layer] = []
        self.changed = False

    def run(self) -> None:
        for layer in list(self.network.layers):
            if layer.inputs:
                self._place(layer)
            self.order.append(layer)
            for t in layer.outputs:
                if t.dtype == F32 and id(t) not in self.roles:
                    self.roles[id(t)] = self._result_role(layer)
        self.network.layers = self.order

    def _is_float(self, t: Tensor) -> bool:
        return id(t) in self.roles or t.dtype in HALF

    def _compute_dtype(self, layer: L.Layer, policy: Policy) -> torch.dtype | None:
        if policy == Policy.AS_IS or not any(self._is_float(t) for t in layer.inputs):
            return None
        roles = {self.roles.get(id(t)) for t in layer.inputs}
        if policy in _FP32 or Role.MODEL in roles:
            return F32
        if policy == Policy.FOLLOW and Role.RULE in roles:
            return F32
        return self.low

    def _policy(self, layer: L.Layer) -> Policy:
        if layer.name in self.keep_fp32 and _policy(layer) != Policy.AS_IS:
            return Policy.FP32_WIDE
        return _policy(layer)

    def _place(self, layer: L.Layer) -> None:
        """Choose the layer's precision, give it its inputs and weights in that precision (a layer with
        no float input, a cast or a shape reads its inputs as they are), and infer its outputs."""
        compute = self._compute_dtype(layer, self._policy(layer))
        if layer.SUBNETWORKS:  # control flow: its sub-networks keep the dtypes they were converted in
            inputs = [t if t.dtype == dtype else self._read(t, dtype) for t, dtype in
                      zip(layer.inputs, layer.input_dtypes())]
            self.changed |= any(a is not b for a, b in zip(inputs, layer.inputs))
            layer.inputs, compute = inputs, None
        if compute is not None:
            inputs = [self._read(t, compute) if self._is_float(t) else t for t in layer.inputs]
            if any(a is not b for a, b in zip(inputs, layer.inputs)):
                layer.inputs = inputs
                self.changed = True
            weights = {k: self._weight(w, compute) for k, w in layer.weights.items()}
            if any(weights[k] is not w for k, w in layer.weights.items()):
                layer.weights = weights
                self.changed = True
        for t, (shape, dtype) in zip(layer.outputs, infer_outputs(layer)):
            t.shape, t.dtype = shape, dtype

    def _weight(self, w: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
        if compute == F32 and w.dtype in HALF:
            return w.to(F32)
        if compute == self.low and w.dtype == F32:
            return w.to(self.low)
        return w

    def _result_role(self, layer: L.Layer) -> Role:
        """The role of an fp32 output of `layer` (placed: its inputs are those it computes on)."""
        if any(self.roles.get(id(t)) == Role.MODEL for t in layer.inputs):
            return Role.MODEL
        if isinstance(layer, L.CastLayer):
            return Role.MODEL if layer.inputs[0].dtype in HALF else Role.FREE
        policy = self._policy(layer)
        if policy == Policy.FP32_WIDE:
            return Role.RULE
        if policy in (Policy.FOLLOW, Policy.FP32_INPUT_RANGE) and \
                any(self.roles.get(id(t)) == Role.RULE for t in layer.inputs):
            return Role.RULE
        return Role.FREE

    def _read(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        """`t` in `dtype`: itself, or a copy made once (a constant narrowed now, anything else by a cast)."""
        if t.dtype == dtype or (dtype == self.low and id(t) not in self.roles):
            return t
        key = (id(t), dtype)
        if key not in self.copies:
            source = t.producer
            if isinstance(source, L.ConstantLayer):
                copy = self.network.add_constant(source.weights["value"].to(dtype),
                                                 name=f"{source.name}.{str(dtype).removeprefix('torch.')}")
            else:
                copy = self.network.add_cast(t, dtype)
            self.order.append(copy)
            self.copies[key] = copy.get_output()
            if dtype == F32:
                self.roles[id(copy.get_output())] = Role.FREE
        return self.copies[key]


def lower_precision(network: Network, settings: BuildSettings) -> bool:
    """Run float layers in `settings.compute_dtype` where safe; fp32 where the model or `_policy` says."""
    low = settings.compute_dtype
    if low == F32:
        return False
    declared = [t.dtype for t in network.outputs]
    pass_ = _Lowering(network, low, settings.keep_fp32)
    pass_.run()
    changed = pass_.changed
    for i, (t, dtype) in enumerate(zip(list(network.outputs), declared)):
        if t.dtype != dtype:
            network.outputs[i] = network.add_cast(t, dtype).get_output()
            changed = True
    return changed
