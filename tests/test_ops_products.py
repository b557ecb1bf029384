"""Product converters (conversion/converters/products.py) through the whole pipeline against eager: cross with
broadcasting and its default dim, kron of unequal ranks, inner, tensordot with reordered dims, linalg.vander; NaN and
infinities where the product is one multiplication per element."""
import pytest
import torch
from harness import assert_falls_back, check_traced


def _special(*shape):
    x = torch.randn(*shape)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return x


@pytest.mark.parametrize("name, fn, shapes", [
    ("cross", lambda a, b: torch.cross(a, b, dim=1), [(4, 3, 2), (4, 3, 2)]),
    ("cross_default_dim", lambda a, b: torch.cross(a, b), [(2, 4, 3), (2, 4, 3)]),
    ("linalg_cross_broadcast", lambda a, b: torch.linalg.cross(a, b), [(5, 3), (1, 3)]),
    ("kron", torch.kron, [(2, 3), (3, 1, 2)]),
    ("inner", torch.inner, [(2, 3, 4), (5, 4)]),
    ("tensordot", lambda a, b: torch.tensordot(a, b, ([0, 2], [2, 0])), [(2, 3, 4), (4, 5, 2)]),
    ("tensordot_int", lambda a, b: torch.tensordot(a, b, 1), [(2, 3, 4), (4, 5)]),
    ("vander", lambda a, b: torch.linalg.vander(a, N=4) + b.sum(), [(3, 5), (1,)]),
])
def test_products(name, fn, shapes):
    check_traced(fn, *(torch.randn(*s) for s in shapes))
    if name.startswith(("cross", "kron", "linalg")):
        check_traced(fn, *(_special(*s) for s in shapes))


def test_tensordot_of_a_size_one_dim_stays_in_pytorch():
    _, report = check_traced(lambda a, b: torch.tensordot(a, b, ([0], [0])) * 2, torch.randn(1, 3), torch.randn(2, 3),
                             engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::tensordot", "eager sums a size-1 side first")


@pytest.mark.parametrize("correction", [0, 1, 5])
def test_cov_and_corrcoef(correction):
    check_traced(lambda x: torch.cov(x, correction=correction), torch.randn(3, 5))
    check_traced(lambda x: torch.cov(x, correction=correction), _special(4, 5))
    check_traced(lambda x: torch.cov(x), torch.randn(5))
    check_traced(torch.corrcoef, torch.randn(3, 6))
    check_traced(torch.corrcoef, _special(3, 6))


@pytest.mark.parametrize("p", [1, 2, 0.5, float("inf")])
def test_pdist(p):
    check_traced(lambda x: torch.pdist(x, p), torch.randn(4, 3))
    check_traced(lambda x: torch.pdist(x, p), _special(4, 3))


def test_pdist_of_order_zero_stays_in_pytorch():
    _, report = check_traced(lambda x: torch.pdist(x, 0) * 2, torch.randn(4, 3), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::pdist", "p=0")
