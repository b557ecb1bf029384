"""Diagonal converters (conversion/converters/diagonal.py) through the whole pipeline against eager: offsets inside
and past the matrix, other dims, non-square inputs, NaN and infinities (an embedded diagonal has exact zeros)."""
import pytest
import torch
from harness import check_traced


def _x(*shape):
    x = torch.randn(*shape)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return x


@pytest.mark.parametrize("offset", [0, 1, -2, 5, -7])
@pytest.mark.parametrize("dims", [(0, 1), (2, 0), (-1, -2)])
def test_diagonal(offset, dims):
    check_traced(lambda x: torch.diagonal(x, offset, *dims) * 2, _x(3, 5, 4))
    check_traced(lambda x: torch.diagonal_copy(x, offset, *dims), _x(3, 5, 4))
    check_traced(lambda x: torch.linalg.diagonal(x, offset=offset, dim1=dims[0], dim2=dims[1]), _x(3, 5, 4))


@pytest.mark.parametrize("offset", [0, 2, -1])
@pytest.mark.parametrize("dims", [(-2, -1), (0, 2), (2, 0)])
def test_diag_embed(offset, dims):
    check_traced(lambda x: torch.diag_embed(x, offset, *dims), _x(2, 4))


@pytest.mark.parametrize("offset", [0, 1, -3])
def test_diag_diagflat_trace(offset):
    check_traced(lambda x: torch.diag(x, offset), _x(5))
    check_traced(lambda x: torch.diag(x, offset), _x(4, 6))
    check_traced(lambda x: torch.diagflat(x, offset), _x(2, 3))
    check_traced(torch.trace, torch.randn(4, 6))
    check_traced(torch.trace, _x(4, 6))


@pytest.mark.parametrize("offset", [0, 2, -1])
@pytest.mark.parametrize("dims", [(0, 1), (2, 0)])
def test_diagonal_scatter(offset, dims):
    x = _x(3, 5, 4)
    src = torch.diagonal(torch.randn(3, 5, 4), offset, *dims).contiguous()
    src.view(-1)[0] = float("nan")
    check_traced(lambda x, s: torch.diagonal_scatter(x, s, offset, *dims), x, src)
