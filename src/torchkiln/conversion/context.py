"""The conversion context: the network being built and what each TorchScript value became."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchkiln.analysis.resolve import Resolver
from torchkiln.errors import ConversionError
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import is_symbolic
from torchkiln.ir.tensor import Tensor
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import TensorMeta, Value, value_key


def scalar_dtype(tensor_dtype: torch.dtype | None, scalar: bool | int | float) -> torch.dtype:
    """The dtype a Python scalar takes next to a tensor of `tensor_dtype` (torch's wrapped-number rule)."""
    if isinstance(scalar, bool):
        return tensor_dtype or torch.bool
    if isinstance(scalar, int):
        return tensor_dtype if tensor_dtype is not None and tensor_dtype != torch.bool else torch.int64
    if tensor_dtype is not None and tensor_dtype.is_floating_point:
        return tensor_dtype
    return torch.get_default_dtype()


class ConversionCtx(Resolver):
    """Holds `network`, `value_tensor_map` (value -> network tensor or list of them) and
    `evaluated_value_map` (value -> static value)."""

    def __init__(self, settings: CompileSettings, metas: Mapping[int, TensorMeta], name: str) -> None:
        super().__init__(metas)
        self.settings = settings
        self.network = Network(name)
        self.value_tensor_map: dict[int, Any] = {}
        self.evaluated_value_map = self._memo

    def known(self, v: Value) -> tuple[bool, Any]:
        key = value_key(v)
        if key in self.value_tensor_map:
            return True, self.value_tensor_map[key]
        return False, None

    def to_tensor(self, x: Any, dtype: torch.dtype | None = None) -> Tensor:
        """A network tensor for `x`: itself, or a constant for a torch.Tensor or Python scalar."""
        if isinstance(x, Tensor):
            return x if dtype is None or x.dtype == dtype else self.network.add_cast(x, dtype).get_output()
        if isinstance(x, torch.Tensor):
            value = x.detach().to(dtype) if dtype is not None else x.detach()
            return self.network.add_constant(value.cpu()).get_output()
        if isinstance(x, (bool, int, float)):
            return self.network.add_constant(torch.tensor(x, dtype=dtype or scalar_dtype(None, x))).get_output()
        if is_symbolic(x):  # a dynamic dim used as a number: its value at run time
            return self.network.add_layer(L.DimValueLayer, [], value=x, dtype=dtype or torch.int64).get_output()
        if isinstance(x, TensorMeta):
            raise ConversionError("a tensor computed outside this engine block reached a converter")
        raise ConversionError(f"cannot make a network tensor of {type(x).__name__} {x!r}")
