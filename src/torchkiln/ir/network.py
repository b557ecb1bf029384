"""The network definition: inputs, layers in execution order, outputs (like INetworkDefinition)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.errors import NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import Dim, DimSymbol, as_shape, bounds, product, symbols_of
from torchkiln.ir.tensor import Tensor


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_2`, `base_3`... : the first name not in `taken`, which then holds it."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


class Network:
    """A layer graph under construction. Each `add_*` infers its outputs' shapes and dtypes at once."""

    def __init__(self, name: str = "network") -> None:
        self.name = name
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.layers: list[L.Layer] = []
        self._names: set[str] = set()
        self.scope = ""  # prefix of default layer names (the conversion names it after the node)
        # layer name -> (the TorchScript node it was converted from, its source line): ("aten::mul(%y)",
        # "model.py:12"), recorded by the conversion for debugging tools; in memory only (not serialized)
        self.origins: dict[str, tuple[str, str]] = {}

    # ---- naming ---------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        return unique_name(base, self._names)

    # ---- inputs and outputs ---------------------------------------------------------------
    def add_input(self, name: str, dtype: torch.dtype, shape: Sequence[Dim]) -> Tensor:
        """A network input; a dynamic dim is a DimSymbol (see `symbolic`)."""
        tensor = Tensor(self.unique_name(name), as_shape(shape), dtype)
        self.inputs.append(tensor)
        return tensor

    def mark_output(self, tensor: Tensor) -> None:
        if tensor in self.outputs:
            raise NetworkError(f"tensor {tensor.name} is already an output")
        self.outputs.append(tensor)

    # ---- layers ---------------------------------------------------------------------------
    def add_layer(
        self,
        layer_class: type[L.Layer],
        inputs: Sequence[Tensor],
        *,
        weights: dict[str, torch.Tensor | None] | None = None,
        name: str | None = None,
        **params: object,
    ) -> L.Layer:
        """Add a layer of any registered kind (checked by its `validate`); the typed `add_*` methods call this."""
        from torchkiln.ir.shape_inference import infer_outputs

        for t in inputs:
            if not isinstance(t, Tensor):
                raise NetworkError(f"{layer_class.KIND} layer input must be a network Tensor, got {type(t).__name__}")
        # Weights live on the CPU in the network (the executor moves them to the device once).
        clean = {k: v.detach().cpu() for k, v in (weights or {}).items() if v is not None}
        default = f"{self.scope}/{layer_class.KIND}" if self.scope else layer_class.KIND
        layer = layer_class(name=self.unique_name(name or default), inputs=list(inputs), weights=clean, **params)
        layer.validate()
        for i, (shape, dtype) in enumerate(infer_outputs(layer)):
            if len(shape) > L.MAX_RANK:
                layer.fail(f"output {i} has rank {len(shape)}, over the limit of {L.MAX_RANK}")
            layer.outputs.append(Tensor(self.unique_name(f"{layer.name}:{i}"), shape, dtype, producer=layer))
        self.layers.append(layer)
        return layer

    def add_constant(self, value: torch.Tensor, name: str | None = None) -> L.Layer:
        return self.add_layer(L.ConstantLayer, [], weights={"value": value}, name=name)

    def add_identity(self, input: Tensor) -> L.Layer:
        return self.add_layer(L.IdentityLayer, [input])

    def add_cast(self, input: Tensor, to_type: torch.dtype) -> L.Layer:
        return self.add_layer(L.CastLayer, [input], to_type=to_type)

    def add_convolution_nd(
        self,
        input: Tensor,
        kernel: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        groups: int = 1,
        transposed: bool = False,
        output_padding: Sequence[int] = (),
    ) -> L.Layer:
        return self.add_layer(
            L.ConvolutionLayer, [input], weights={"kernel": kernel, "bias": bias},
            stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups,
            transposed=transposed, output_padding=tuple(output_padding),
        )

    def add_scale(
        self,
        input: Tensor,
        mode: L.ScaleMode,
        scale: torch.Tensor | None = None,
        shift: torch.Tensor | None = None,
        power: torch.Tensor | None = None,
        channel_axis: int = 1,
    ) -> L.Layer:
        return self.add_layer(
            L.ScaleLayer, [input], weights={"scale": scale, "shift": shift, "power": power},
            mode=mode, channel_axis=channel_axis,
        )

    def add_activation(self, input: Tensor, type: L.ActivationType, alpha: float = 0.0, beta: float = 0.0) -> L.Layer:
        return self.add_layer(L.ActivationLayer, [input], type=type, alpha=float(alpha), beta=float(beta))

    def add_parametric_relu(self, input: Tensor, slope: torch.Tensor) -> L.Layer:
        return self.add_layer(L.ParametricReLULayer, [input], weights={"slope": slope})

    def add_elementwise(self, a: Tensor, b: Tensor, op: L.ElementWiseOperation) -> L.Layer:
        return self.add_layer(L.ElementWiseLayer, [a, b], op=op)

    def add_unary(self, input: Tensor, op: L.UnaryOperation) -> L.Layer:
        return self.add_layer(L.UnaryLayer, [input], op=op)

    def add_pooling_nd(
        self,
        input: Tensor,
        type: L.PoolingType,
        window: Sequence[int],
        *,
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int] = (),
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> L.Layer:
        return self.add_layer(
            L.PoolingLayer, [input], type=type, window=tuple(window), stride=tuple(stride),
            padding=tuple(padding), dilation=tuple(dilation), ceil_mode=ceil_mode,
            count_include_pad=count_include_pad, divisor_override=divisor_override,
        )

    def add_matrix_multiply(
        self, a: Tensor, op0: L.MatrixOperation, b: Tensor, op1: L.MatrixOperation
    ) -> L.Layer:
        return self.add_layer(L.MatrixMultiplyLayer, [a, b], op0=op0, op1=op1)

    def add_shuffle(
        self,
        input: Tensor,
        first_transpose: Sequence[int] | None = None,
        reshape_dims: Sequence[int] | None = None,
        second_transpose: Sequence[int] | None = None,
        zero_is_placeholder: bool = True,
    ) -> L.Layer:
        def opt(v: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
            return None if v is None else as_shape(v)

        return self.add_layer(
            L.ShuffleLayer, [input], first_transpose=opt(first_transpose), reshape_dims=opt(reshape_dims),
            second_transpose=opt(second_transpose), zero_is_placeholder=zero_is_placeholder,
        )

    def add_reduce(self, input: Tensor, op: L.ReduceOperation, axes: Sequence[int], keep_dims: bool) -> L.Layer:
        return self.add_layer(L.ReduceLayer, [input], op=op, axes=tuple(axes), keep_dims=keep_dims)

    def add_softmax(self, input: Tensor, axis: int, log: bool = False) -> L.Layer:
        return self.add_layer(L.SoftMaxLayer, [input], axis=axis, log=log)

    def add_concatenation(self, inputs: Sequence[Tensor], axis: int) -> L.Layer:
        return self.add_layer(L.ConcatenationLayer, list(inputs), axis=axis)

    def add_slice(self, input: Tensor, start: Sequence[int], shape: Sequence[int], stride: Sequence[int]) -> L.Layer:
        return self.add_layer(L.SliceLayer, [input], start=tuple(start), shape=tuple(shape), stride=tuple(stride))

    def add_expand(self, input: Tensor, shape: Sequence[int]) -> L.Layer:
        return self.add_layer(L.ExpandLayer, [input], shape=tuple(shape))

    def add_gather(self, data: Tensor, indices: Tensor, axis: int, mode: L.GatherMode = L.GatherMode.DEFAULT) -> L.Layer:
        return self.add_layer(L.GatherLayer, [data, indices], axis=axis, mode=mode)

    def add_scatter(self, data: Tensor, indices: Tensor, updates: Tensor, axis: int) -> L.Layer:
        return self.add_layer(L.ScatterLayer, [data, indices, updates], axis=axis)

    def add_select(self, condition: Tensor, then_input: Tensor, else_input: Tensor) -> L.Layer:
        return self.add_layer(L.SelectLayer, [condition, then_input, else_input])

    def add_topk(self, input: Tensor, op: L.TopKOperation, k: int, axis: int) -> L.Layer:
        return self.add_layer(L.TopKLayer, [input], op=op, k=k, axis=axis)

    def add_non_zero(self, input: Tensor) -> L.Layer:
        return self.add_layer(L.NonZeroLayer, [input], count=self.data_symbol(input))

    def add_unique(self, input: Tensor, consecutive: bool = False) -> L.Layer:
        return self.add_layer(L.UniqueLayer, [input], count=self.data_symbol(input), consecutive=consecutive)

    def data_symbol(self, input: Tensor) -> DimSymbol:
        """A new symbol for the output size of a data-dependent layer reading `input`: [0, its most elements]."""
        taken = {s.name for s in self.symbols()}
        name = next(f"u{i}" for i in range(len(taken) + 1) if f"u{i}" not in taken)
        return DimSymbol(name, 0, int(bounds(product(input.shape))[1]))

    def add_resize(
        self,
        input: Tensor,
        mode: str,
        size: Sequence[int] | None = None,
        scales: Sequence[float] | None = None,
        align_corners: bool | None = None,
    ) -> L.Layer:
        return self.add_layer(
            L.ResizeLayer, [input], mode=mode, size=None if size is None else tuple(size),
            scales=None if scales is None else tuple(float(s) for s in scales), align_corners=align_corners,
        )

    def add_padding(self, input: Tensor, pad: Sequence[int], mode: L.PaddingMode, value: float = 0.0) -> L.Layer:
        return self.add_layer(L.PaddingLayer, [input], pad=tuple(pad), mode=mode, value=float(value))

    def add_normalization(
        self,
        input: Tensor,
        kind: L.NormalizationKind,
        epsilon: float,
        scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        normalized_shape: Sequence[int] = (),
        num_groups: int = 1,
    ) -> L.Layer:
        return self.add_layer(
            L.NormalizationLayer, [input], weights={"scale": scale, "bias": bias}, kind=kind,
            epsilon=float(epsilon), normalized_shape=tuple(normalized_shape), num_groups=num_groups,
        )

    def add_einsum(self, inputs: Sequence[Tensor], equation: str) -> L.Layer:
        return self.add_layer(L.EinsumLayer, list(inputs), equation=equation)

    def add_cumulative(self, input: Tensor, op: L.CumulativeOperation, axis: int) -> L.Layer:
        return self.add_layer(L.CumulativeLayer, [input], op=op, axis=axis)

    def add_fill(self, length: int, start: float, step: float, dtype: torch.dtype) -> L.Layer:
        return self.add_layer(
            L.FillLayer, [], op=L.FillOperation.LINSPACE, length=length, start=float(start), step=float(step),
            dtype=dtype,
        )

    def add_fake_quantize(self, input: Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
                          quant_type: torch.dtype = torch.int8, axis: int | None = None,
                          bounds: tuple[int, int] = (-128, 127), divide: bool = False) -> Tensor:
        """A quantize layer and the dequantize layer reading it (TensorRT's explicit Q/DQ pair): the dequantized
        value, in `input`'s float dtype. `bounds` is the int8 range values are clamped to; `divide`: the quantizer
        divides by the scale (QuantizeLayer)."""
        quant = {"axis": axis, "quant_type": quant_type}
        weights = {"scale": scale.float().reshape(-1), "zero_point": None if zero_point is None else
                   zero_point.to(torch.int8).reshape(-1)}
        q = self.add_layer(L.QuantizeLayer, [input], weights=weights, quant_min=bounds[0], quant_max=bounds[1],
                           divide=divide, **quant)
        return self.add_layer(L.DequantizeLayer, q.outputs, weights=weights, to_type=input.dtype,
                              **quant).outputs[0]

    def add_shape(self, input: Tensor) -> L.Layer:
        return self.add_layer(L.ShapeLayer, [input])

    def add_grid_sample(
        self, input: Tensor, grid: Tensor, mode: str, padding_mode: str, align_corners: bool
    ) -> L.Layer:
        return self.add_layer(
            L.GridSampleLayer, [input, grid], mode=mode, padding_mode=padding_mode, align_corners=align_corners
        )

    def add_attention(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> L.Layer:
        inputs = [query, key, value] + ([mask] if mask is not None else [])
        return self.add_layer(L.AttentionLayer, inputs, causal=causal, scale=scale, enable_gqa=enable_gqa)

    def add_conditional(self, predicate: Tensor, operands: Sequence[Tensor], then_branch: Network,
                        else_branch: Network) -> L.Layer:
        """IIfConditionalLayer: one branch's outputs on `operands` (the branches' inputs), by a 0-d bool."""
        return self.add_layer(L.ConditionalLayer, [predicate, *operands], then_branch=then_branch,
                              else_branch=else_branch)

    def add_loop(self, trip_count: Tensor, condition: Tensor, carried: Sequence[Tensor], read: Sequence[Tensor],
                 body: Network, max_trips: int) -> L.Layer:
        """ILoopLayer: `body` (iteration, *carried, *read) -> (condition, *carried) while the condition holds, at
        most `trip_count` times (and never more than `max_trips`, a static bound)."""
        return self.add_layer(L.LoopLayer, [trip_count, condition, *carried, *read], num_carried=len(carried),
                              max_trips=max_trips, body=body)

    # ---- rewriting (used by the builder) ---------------------------------------------------
    def replace_all_uses(self, old: Tensor, new: Tensor) -> None:
        """Make every reader of `old` (layers and network outputs) read `new` instead."""
        for layer in self.layers:
            layer.inputs = [new if t is old else t for t in layer.inputs]
        self.outputs = [new if t is old else t for t in self.outputs]

    def remove_layers(self, doomed: set[int]) -> None:
        """Drop the layers whose id() is in `doomed`."""
        self.layers = [layer for layer in self.layers if id(layer) not in doomed]

    def move_before(self, layer: L.Layer, anchor: L.Layer | None) -> None:
        """Place `layer` just before `anchor` in execution order (first when anchor is None)."""
        self.layers.remove(layer)
        self.layers.insert(0 if anchor is None else self.layers.index(anchor), layer)

    def reinfer(self) -> None:
        """Recompute every layer's output shapes and dtypes, in order, after a rewrite."""
        from torchkiln.ir.shape_inference import infer_outputs

        for layer in self.layers:
            for t, (shape, dtype) in zip(layer.outputs, infer_outputs(layer)):
                t.shape, t.dtype = shape, dtype

    # ---- inspection -----------------------------------------------------------------------
    def symbols(self) -> list:
        """The DimSymbols of the inputs' dynamic dims and of data-dependent output sizes, by name (empty for a
        network of static shapes)."""
        return sorted(symbols_of([t.shape for t in self.inputs]) | set(self.data_symbols()), key=lambda s: s.name)

    def data_symbols(self) -> dict[DimSymbol, L.Layer]:
        """Each data-dependent output size and the layer that defines it (binds it when it has run)."""
        found: dict[DimSymbol, L.Layer] = {}
        for layer in self.layers:
            s = L.data_dependent_symbol(layer)
            if s is not None:
                if s in found:
                    raise NetworkError(f"layers {found[s].name!r} and {layer.name!r} both define symbol {s.name}")
                found[s] = layer
        return found

    def consumers(self) -> dict[int, list[L.Layer]]:
        """id(tensor) -> layers that read it."""
        users: dict[int, list[L.Layer]] = {}
        for layer in self.layers:
            for t in layer.inputs:
                users.setdefault(id(t), []).append(layer)
        return users

    def sole_reader(self, t: Tensor, readers: dict[int, list[L.Layer]]) -> L.Layer | None:
        """The one layer that reads `t` (once), where `t` is not a network output; else None. `readers` is
        `consumers()`, which the caller computes once and again after a rewrite that changes who reads what."""
        found = readers.get(id(t), [])
        return found[0] if len(found) == 1 and t not in self.outputs else None

    def __str__(self) -> str:
        from torchkiln.ir.dump import dump

        return dump(self)
