"""Comparison converters (eq, ne, gt, ge, lt, le: tensor, scalar and in-place forms) and elementwise
maximum/minimum. Comparisons give bool; in place, `x.eq_(y)` keeps x's dtype."""
from __future__ import annotations

from torchkiln.conversion.impl.elementwise import binary_converter
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.conversion.registry import converter
from torchkiln.network import layers as L

E = L.ElementWiseOperation

_COMPARISONS = {
    "eq": E.EQUAL, "ne": E.NOT_EQUAL, "gt": E.GREATER, "ge": E.GREATER_EQUAL, "lt": E.LESS, "le": E.LESS_EQUAL,
}

for _name, _op in _COMPARISONS.items():
    _convert = converter(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar")(binary_converter(_op))
    register_inplace(_convert, f"aten::{_name}_.Tensor", f"aten::{_name}_.Scalar")

converter("aten::maximum", "aten::max.other")(binary_converter(E.MAX))
converter("aten::minimum", "aten::min.other")(binary_converter(E.MIN))
