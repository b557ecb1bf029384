"""Two-operand einsum as a matrix multiply between shuffles, as torch itself computes it (permute, reshape, bmm):
the backends then see a matrix multiply, which their fusions (attention, GEMM epilogues) know, instead of an
einsum they run as one opaque call."""
from __future__ import annotations

import math
from collections.abc import Sequence

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.matmul import NONE, TRANSPOSE, matmul
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def _parse(equation: str, ranks: Sequence[int]) -> tuple[list[str], str] | None:
    """The operands' subscripts and the output's, for an explicit equation without ellipsis or a subscript
    repeated within one term; None otherwise."""
    equation = equation.replace(" ", "")
    if equation.count("->") != 1 or "." in equation:
        return None
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks) or any(len(t) != r or len(set(t)) != r for t, r in zip(terms, ranks)):
        return None
    if len(set(out)) != len(out) or not set(out) <= set("".join(terms)) or not all(c.isalpha() for c in out):
        return None
    return terms, out


def _mergeable(groups: Sequence[str], sizes: dict[str, object]) -> bool:
    """Each group of several subscripts has static sizes (it becomes one dim of their product)."""
    return all(len(g) < 2 or all(isinstance(sizes[c], int) for c in g) for g in groups)


def _arrange(ctx: ConversionCtx, x: Tensor, term: str, batch: str, groups: Sequence[str],
             sizes: dict[str, object]) -> Tensor:
    """`x` (subscripts `term`) permuted to `batch` then `groups`, each group of several subscripts one dim."""
    perm = [term.index(c) for c in batch + "".join(groups)]
    if perm != list(range(len(perm))):
        x = permute(ctx, x, perm)
    if all(len(g) == 1 for g in groups):
        return x
    return reshape(ctx, x, [sizes[c] for c in batch] + [math.prod(sizes[c] for c in g) for g in groups])


def _sum_out(ctx: ConversionCtx, x: Tensor, term: str, keep: str) -> tuple[Tensor, str]:
    """`x` with the subscripts of `term` not in `keep` summed out."""
    lone = [i for i, c in enumerate(term) if c not in keep]
    if not lone:
        return x, term
    return reduce(ctx, x, L.ReduceOperation.SUM, lone, False), "".join(c for c in term if c in keep)


def einsum_as_matmul(ctx: ConversionCtx, a: Tensor, b: Tensor, equation: str) -> Tensor | None:
    """`torch.einsum(equation, a, b)` as shuffles around one matrix multiply, or None where the equation is not a
    contraction of two floating tensors of one dtype with a row, a column and a contracted subscript (ellipsis, a
    diagonal, an outer product, a broadcast contracted dim, a dynamic size in a merged group): the caller keeps
    its einsum layer."""
    parsed = _parse(equation, [a.rank, b.rank])
    if parsed is None or a.dtype != b.dtype or not a.dtype.is_floating_point:
        return None
    (ta, tb), out = parsed
    contracted = "".join(c for c in ta if c in tb and c not in out)
    rows = "".join(c for c in ta if c not in tb and c in out)
    cols = "".join(c for c in tb if c not in ta and c in out)
    batch = "".join(c for c in out if c in ta and c in tb)
    sizes_a, sizes_b = dict(zip(ta, a.shape)), dict(zip(tb, b.shape))
    if not (rows and cols and contracted) or not all(isinstance(sizes_a[c], int) and sizes_a[c] == sizes_b[c]
                                                      for c in contracted):
        return None
    if not (_mergeable([rows, contracted], sizes_a) and _mergeable([cols], sizes_b)):
        return None
    a, ta = _sum_out(ctx, a, ta, tb + out)  # a subscript of one operand only, not in the output
    b, tb = _sum_out(ctx, b, tb, ta + out)
    # b as [batch, k, n], or as [batch, n, k] multiplied transposed where that is its order already
    transposed = [tb.index(c) for c in batch + cols + contracted] == list(range(len(tb)))
    x = _arrange(ctx, a, ta, batch, [rows, contracted], sizes_a)
    y = _arrange(ctx, b, tb, batch, [cols, contracted] if transposed else [contracted, cols], sizes_b)
    product = matmul(ctx, x, y, TRANSPOSE if transposed else NONE)
    if len(rows) > 1 or len(cols) > 1:
        product = reshape(ctx, product, list(product.shape[:len(batch)]) + [sizes_a[c] for c in rows]
                          + [sizes_b[c] for c in cols])
    natural = batch + rows + cols
    perm = [natural.index(c) for c in out]
    return product if perm == list(range(len(perm))) else permute(ctx, product, perm)
