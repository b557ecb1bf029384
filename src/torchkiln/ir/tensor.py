"""A tensor of the layer network: a name, a shape (ints and symbolic dims, see `symbolic`) and a dtype."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from torchkiln.ir.symbolic import Dim, dim_str, has_symbols

if TYPE_CHECKING:
    from torchkiln.ir.layers import Layer


@dataclasses.dataclass(eq=False)
class Tensor:
    """One value flowing between layers; `producer` is None for a network input."""

    name: str
    shape: tuple[Dim, ...]
    dtype: torch.dtype
    producer: Layer | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return has_symbols(self.shape)

    def __repr__(self) -> str:
        dims = ", ".join(dim_str(d) for d in self.shape)
        return f"%{self.name}: {str(self.dtype).removeprefix('torch.')}[{dims}]"
