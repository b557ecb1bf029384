"""Comparison converters (eq, ne, gt, ge, lt, le: tensor and scalar forms) and elementwise maximum/minimum.
Comparisons give bool; the in-place forms (`x.eq_(y)`, which keeps x's dtype) reach conversion as
`x.copy_(x.eq(y))` (lowering's remove_mutation rewrites them)."""
from __future__ import annotations

from torchkiln.conversion.impl.elementwise import binary_converter
from torchkiln.analysis.registry import converter
from torchkiln.ir import layers as L

E = L.ElementWiseOperation

_COMPARISONS = {
    "eq": E.EQUAL, "ne": E.NOT_EQUAL, "gt": E.GREATER, "ge": E.GREATER_EQUAL, "lt": E.LESS, "le": E.LESS_EQUAL,
}

for _name, _op in _COMPARISONS.items():
    converter(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar")(binary_converter(_op))

converter("aten::maximum", "aten::max.other")(binary_converter(E.MAX))
converter("aten::minimum", "aten::min.other")(binary_converter(E.MIN))
