"""Logical and bitwise converters: logical_and/or/xor, bitwise_and/or/xor and the `&`, `|`, `^`
operators on tensors (and their in-place forms)."""
from __future__ import annotations

from torchkiln.conversion.impl.elementwise import binary_converter
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.ir import layers as L

E = L.ElementWiseOperation

for _name, _op in {"and": E.AND, "or": E.OR, "xor": E.XOR}.items():  # in place: see comparison.py
    converter(f"aten::logical_{_name}")(binary_converter(_op))

for _name, _op in {"and": E.BITWISE_AND, "or": E.BITWISE_OR, "xor": E.BITWISE_XOR}.items():
    _convert = converter(f"aten::bitwise_{_name}.Tensor", f"aten::bitwise_{_name}.Scalar",
                         f"aten::bitwise_{_name}.Scalar_Tensor",
                         f"aten::__{_name}__.Tensor", f"aten::__{_name}__.Scalar")(binary_converter(_op))
    register_inplace(_convert, f"aten::bitwise_{_name}_.Tensor", f"aten::bitwise_{_name}_.Scalar",
                     f"aten::__i{_name}__.Tensor", f"aten::__i{_name}__.Scalar")
