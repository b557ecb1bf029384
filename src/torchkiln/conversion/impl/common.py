"""Small helpers every converter family uses."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchkiln.analysis.resolve import Args
from torchkiln.errors import ConversionError
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import Node, TensorMeta, node_schema

VIEW_OPS = frozenset({
    "aten::view", "aten::reshape", "aten::select", "aten::slice", "aten::transpose", "aten::permute",
    "aten::squeeze", "aten::unsqueeze", "aten::expand", "aten::expand_as", "aten::t", "aten::narrow",
    "aten::flatten", "aten::unflatten", "aten::chunk", "aten::split", "aten::unbind", "aten::as_strided",
    "aten::diagonal", "aten::detach", "aten::alias", "aten::__getitem__", "aten::view_as", "aten::unfold",
})


# TorchScript passes dtypes as c10::ScalarType codes (ints); index = code.
SCALAR_TYPES: tuple[torch.dtype | None, ...] = (
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64,
    torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.qint8, torch.quint8, torch.qint32,
    torch.bfloat16,
)


def to_dtype(code: int | torch.dtype | None) -> torch.dtype | None:
    """The torch.dtype of a TorchScript ScalarType argument (an int code, or already a dtype)."""
    if code is None or isinstance(code, torch.dtype):
        return code
    if isinstance(code, int) and 0 <= code < len(SCALAR_TYPES):
        return SCALAR_TYPES[code]
    raise ConversionError(f"unknown ScalarType code {code!r}")


def dtype_code(dtype: torch.dtype) -> int:
    """The ScalarType code TorchScript uses for `dtype` (what prim::dtype returns)."""
    return SCALAR_TYPES.index(dtype)


def normalize_dim(dim: int, rank: int) -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise ConversionError(f"dim {dim} is out of range for a tensor of rank {rank}")
    return dim % max(rank, 1)


def normalize_dims(dims: Sequence[int] | int | None, rank: int) -> list[int]:
    """A list of non-negative dims; None or [] means every dim."""
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, rank) for d in dims}) if dims else list(range(rank))


def expand_param(values: Sequence[int] | int, nd: int) -> tuple[int, ...]:
    """Pool/conv parameters given for one dim apply to all `nd` dims."""
    if isinstance(values, int):
        return (values,) * nd
    values = tuple(values)
    return values * nd if len(values) == 1 else values


def is_tensor_like(x: Any) -> bool:
    return isinstance(x, (Tensor, TensorMeta, torch.Tensor))


def needs_static(args: Args, *names: str) -> str | None:
    """Capability helper: these arguments must be constants (weights), not run-time tensors."""
    for name in names:
        value = args.get(name)
        if isinstance(value, (Tensor, TensorMeta)):
            return f"argument {name!r} must be a constant weight, not a run-time tensor"
    return None


def functional_inplace(args: Args) -> str | None:
    """Capability of in-place ops: converting `x.op_(...)` functionally is right only when nothing
    reads the old `x` afterwards and `x` is neither a method input nor a view of another tensor."""
    node = args.node
    target = node.inputsAt(0)
    producer = target.node()
    if producer.kind() == "prim::Param":
        return f"it modifies the method input %{target.debugName()} in place"
    if producer.kind() in VIEW_OPS:
        return f"it modifies %{target.debugName()}, a view made by {producer.kind()}, in place"
    for use in target.uses():
        user = use.user
        while user.owningBlock() != node.owningBlock():
            user = user.owningBlock().owningNode()
        if user.isAfter(node):
            return f"%{target.debugName()} is read after it is modified in place"
        if use.user != node and _may_alias(use.user, use.offset):
            return f"%{target.debugName()} has an alias made by {use.user.kind()} that would see the change"
    return None


def _may_alias(user: Node, offset: int) -> bool:
    """Whether `user`'s input `offset` may share memory with something it returns or holds (a view, a
    list or tuple of it, another in-place op); nodes without a schema are assumed to."""
    schema = node_schema(user)
    if schema is None:
        return True
    arguments = torch._C.parse_schema(schema).arguments
    return offset >= len(arguments) or arguments[offset].alias_info is not None


def one_dtype(*names: str | int, floating: bool = False) -> Callable[[Args], str | None]:
    """Capability: these tensors share one real, non-bool dtype (floating, if asked); mixed dtypes would need
    eager's promotion rules."""
    def check(args: Args) -> str | None:
        dtypes = {args[n].dtype for n in names if is_tensor_like(args[n])}
        dtype = next(iter(dtypes))
        if len(dtypes) != 1 or dtype.is_complex or dtype == torch.bool or (floating and not dtype.is_floating_point):
            return f"operand dtypes {sorted(map(str, dtypes))} (only one real{' floating' if floating else ''} dtype)"
        return None

    return check
