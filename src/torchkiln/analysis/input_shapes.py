"""What lowering may know of a method input's shape before shape analysis: its static dims, and a symbol for
each dim whose range is more than one value (a dynamic dim is not its opt value)."""
from __future__ import annotations

import torch

from torchkiln.ir.symbolic import DimSymbol
from torchkiln.torchscript import TensorMeta


def input_meta(position: int, min_shape: tuple[int, ...], opt_shape: tuple[int, ...], max_shape: tuple[int, ...],
               dtype: torch.dtype, device: torch.device) -> TensorMeta:
    """The meta of method input `position`: `l[x.size(0) - 2]` or `range(x.size(0))` are not settled by a
    dynamic dim's opt value."""
    shape = tuple(lo if lo == hi else DimSymbol(f"input{position}_dim{d}", lo, hi, samples=(lo, opt, hi))
                  for d, (lo, opt, hi) in enumerate(zip(min_shape, opt_shape, max_shape)))
    return TensorMeta(shape, dtype, device)
