"""Shape converters: view, reshape, ravel, flatten, unflatten, permute, movedim, transpose, t, numpy_T, mT, mH,
squeeze, unsqueeze."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim, normalize_dims
from torchkiln.conversion.impl.shuffle import permute, reshape, squeeze_dims, unsqueeze
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::view", "aten::reshape", "aten::view_copy", "aten::_reshape_copy")
def view(ctx: ConversionCtx, args: Args) -> Tensor:
    return reshape(ctx, ctx.to_tensor(args.self), args[1])


@converter("aten::flatten.using_ints")
def flatten(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    if x.rank == 0:
        return reshape(ctx, x, [1])
    start, end = normalize_dim(args.start_dim, x.rank), normalize_dim(args.end_dim, x.rank)
    merged = 1
    for d in x.shape[start:end + 1]:
        merged *= d
    return reshape(ctx, x, list(x.shape[:start]) + [merged] + list(x.shape[end + 1:]))


@converter("aten::permute", "aten::permute_copy")
def permute_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    return permute(ctx, x, [normalize_dim(d, x.rank) for d in args.dims])


@converter("aten::transpose.int", "aten::transpose_copy.int")
def transpose(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    perm = list(range(x.rank))
    a, b = normalize_dim(args.dim0, x.rank), normalize_dim(args.dim1, x.rank)
    if x.rank:  # a 0-d tensor takes dims 0 and -1 and is its own transpose
        perm[a], perm[b] = perm[b], perm[a]
    return permute(ctx, x, perm)


@converter("aten::view_as", "aten::reshape_as")
def view_as(ctx: ConversionCtx, args: Args) -> Tensor:
    return reshape(ctx, ctx.to_tensor(args.self), args.other.shape)


@converter("aten::unflatten.int")
def unflatten(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    return reshape(ctx, x, list(x.shape[:dim]) + list(args.sizes) + list(x.shape[dim + 1:]))


@converter("aten::t", "aten::t_copy")
def t(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    return permute(ctx, x, [1, 0]) if x.rank == 2 else x


@converter("aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::squeeze_copy", "aten::squeeze_copy.dim",
           "aten::squeeze_copy.dims")
def squeeze(ctx: ConversionCtx, args: Args) -> Tensor:
    x, dims = ctx.to_tensor(args.self), args.get("dim")
    if x.rank == 0 or dims == []:  # squeeze(dim=[]) squeezes nothing
        return x
    return squeeze_dims(ctx, x, normalize_dims(dims, x.rank))


@converter("aten::unsqueeze", "aten::unsqueeze_copy")
def unsqueeze_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    return unsqueeze(ctx, x, normalize_dim(args.dim, x.rank + 1))


@converter("aten::ravel")
def ravel(ctx: ConversionCtx, args: Args) -> Tensor:
    return reshape(ctx, ctx.to_tensor(args.self), [-1])


@converter("aten::movedim.int", "aten::movedim.intlist")
def movedim(ctx: ConversionCtx, args: Args) -> Tensor:
    """Each source dim moves to its destination; the other dims keep their order in the free places."""
    x = ctx.to_tensor(args.self)
    source, destination = args.source, args.destination
    source = [source] if isinstance(source, int) else list(source)
    destination = [destination] if isinstance(destination, int) else list(destination)
    source = [normalize_dim(d, x.rank) for d in source]
    destination = [normalize_dim(d, x.rank) for d in destination]
    perm: list[int | None] = [None] * x.rank
    for s, d in zip(source, destination):
        perm[d] = s
    rest = iter(d for d in range(x.rank) if d not in source)
    return permute(ctx, x, [next(rest) if p is None else p for p in perm])


@converter("aten::numpy_T")
def numpy_t(ctx: ConversionCtx, args: Args) -> Tensor:
    """Tensor.T: all dims reversed."""
    x = ctx.to_tensor(args.self)
    return permute(ctx, x, list(reversed(range(x.rank))))


def _matrix(args: Args) -> str | None:
    rank = len(args.self.shape)
    if args.self.dtype.is_complex:
        return "complex tensors are not supported (mH conjugates)"
    if rank == 1 or (rank > 2 and args.node.kind() == "aten::matrix_H"):
        return f"a {rank}-d tensor (eager raises)"
    return None


@converter("aten::mT", "aten::mH", "aten::adjoint", "aten::matrix_H", capability=_matrix)
def matrix_transpose(ctx: ConversionCtx, args: Args) -> Tensor:
    """The last two dims swapped (of a real tensor, mH, adjoint and H are mT; of a 0-d tensor, the identity)."""
    x = ctx.to_tensor(args.self)
    if x.rank == 0:
        return x
    return permute(ctx, x, list(range(x.rank - 2)) + [x.rank - 1, x.rank - 2])
