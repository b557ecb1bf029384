"""Evaluators of a tensor's metadata: size, dim, numel, dtype, device. They need only its shape and dtype.

dtype and device come from what eager PyTorch gave (shape analysis), so they agree between partitioning
and conversion even where the engine computes in another dtype (truncate_long_and_double).
"""
from __future__ import annotations

from typing import Any

import torch

from torchkiln.conversion.impl.common import dtype_code, normalize_dim
from torchkiln.analysis.registry import evaluator
from torchkiln.analysis.resolve import Args, NotStatic
from torchkiln.ir.symbolic import Dim, product
from torchkiln.torchscript import TensorMeta, value_key


def _meta(args: Args) -> Any:
    """What eager PyTorch knows of argument 0: its TensorMeta from shape analysis, or the value itself."""
    meta = args.metas.get(value_key(args.node.inputsAt(0)))
    return meta if isinstance(meta, TensorMeta) else args[0]


# With dynamic shapes a dim may be symbolic (ir/symbolic.py): these evaluators then return the symbolic
# dim, never the size shape analysis happened to see, and the arithmetic on it stays symbolic.

@evaluator("aten::size", "prim::shape")
def size(args: Args) -> list[Dim]:
    return list(args[0].shape)


@evaluator("aten::size.int")
def size_int(args: Args) -> Dim:
    shape = tuple(args[0].shape)
    return shape[normalize_dim(args[1], len(shape))]


@evaluator("aten::len.Tensor")
def len_tensor(args: Args) -> Dim:
    shape = tuple(args[0].shape)
    if not shape:
        raise NotStatic("len() of a 0-d tensor")
    return shape[0]


@evaluator("aten::dim")
def dim(args: Args) -> int:
    return len(args[0].shape)


@evaluator("aten::numel")
def numel(args: Args) -> Dim:
    return product(args[0].shape)


@evaluator("aten::is_floating_point")
def is_floating_point(args: Args) -> bool:
    return _meta(args).dtype.is_floating_point


@evaluator("prim::dtype")
def dtype(args: Args) -> int:
    """The ScalarType code TorchScript uses for the tensor's dtype."""
    return dtype_code(_meta(args).dtype)


@evaluator("prim::device")
def device(args: Args) -> torch.device:
    found = _meta(args)
    if not isinstance(found, (TensorMeta, torch.Tensor)):
        raise NotStatic("the device of a tensor shape analysis did not see")
    return found.device


@evaluator("prim::type")
def device_type(args: Args) -> str:
    """`device.type`: 'cpu', 'cuda'."""
    return args[0].type
