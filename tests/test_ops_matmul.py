"""Matrix product converters through the whole pipeline: baddbmm, addbmm, addmm, mv, dot, einsum."""
import pytest
import torch
import torchkiln
from harness import Traced, check_fn, check_traced
from torchkiln.runtime.engine import Engine


def baddbmm(x, y, z):
    return torch.baddbmm(x, y, z)


def baddbmm_scaled(x, y, z):
    return torch.baddbmm(x, y, z, beta=0.5, alpha=-2.0)


def baddbmm_beta_zero(x, y, z):
    return torch.baddbmm(x, y, z, beta=0)


def addbmm(x, y, z):
    return torch.addbmm(x, y, z, beta=2, alpha=0.5)


def addmm_beta_zero(x, y, z):
    return torch.addmm(x, y, z, beta=0.0)


def mv(x, y):
    return torch.mv(x, y)


def dot(x, y):
    return torch.dot(x, y)


def _with_nan(*shape: int) -> torch.Tensor:
    x = torch.randn(*shape)
    x.view(-1)[0] = float("nan")  # with beta=0 eager ignores self, nan included
    return x


@pytest.mark.parametrize("fn,op,shapes", [
    (baddbmm, "aten::baddbmm", [(3, 4, 5), (3, 4, 6), (3, 6, 5)]),
    (baddbmm, "aten::baddbmm", [(1, 4, 1), (3, 4, 6), (3, 6, 5)]),  # self broadcasts
    (baddbmm_scaled, "aten::baddbmm", [(5,), (3, 4, 6), (3, 6, 5)]),
    (baddbmm_beta_zero, "aten::baddbmm", [None, (3, 4, 6), (3, 6, 5)]),
    (addbmm, "aten::addbmm", [(4, 5), (3, 4, 6), (3, 6, 5)]),
    (addmm_beta_zero, "aten::addmm", [None, (4, 6), (6, 5)]),
    (mv, "aten::mv", [(4, 6), (6,)]),
    (dot, "aten::dot", [(6,), (6,)]),
])
def test_matrix_products(fn, op, shapes):
    out_shape = [(3, 4, 5), (4, 5)][fn is addmm_beta_zero]
    tensors = [_with_nan(*out_shape) if s is None else torch.randn(*s) for s in shapes]
    check_fn(fn, *tensors, op=op)


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bchw,bcHw->bhH", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk", [(2, 3, 4), (4, 2)]),
    ("bnhd,bmhd->bhnm", [(2, 5, 2, 4), (2, 3, 2, 4)]),
    ("B G H I D, B G H J D -> B G H I J", [(2, 3, 2, 5, 4), (2, 3, 2, 6, 4)]),
    ("bij,jk->bik", [(2, 3, 4), (4, 5)]),
    ("bij,bjk->kbi", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),
    ("nchw,kchw->nk", [(2, 3, 4, 5), (6, 3, 4, 5)]),
    ("bij,bkj->bki", [(2, 3, 4), (2, 5, 4)]),
    ("aij,jk->ik", [(2, 3, 4), (4, 5)]),
    ("aij,jk->k", [(2, 3, 4), (4, 5)]),
    ("bxi,byj,ij->bxy", [(2, 3, 4), (2, 5, 6), (4, 6)]),
])
def test_einsum(equation, shapes):
    tensors = [torch.randn(*s) for s in shapes]
    check_traced(lambda *ts: torch.einsum(equation, *ts), *tensors, op="aten::einsum")


@pytest.mark.parametrize("equation,shapes,kinds", [
    ("B G H I D, B G H J D -> B G H I J", [(2, 3, 2, 5, 4), (2, 3, 2, 6, 4)], {"matrix_multiply"}),
    ("bij,jk->bik", [(2, 3, 4), (4, 5)], {"matrix_multiply", "shuffle"}),
    ("bij,bjk->kbi", [(2, 3, 4), (2, 4, 5)], {"matrix_multiply", "shuffle"}),
    ("aij,jk->ik", [(2, 3, 4), (4, 5)], {"matrix_multiply", "reduce"}),
    ("ii->i", [(4, 4)], {"einsum"}),
    ("i,j->ij", [(3,), (4,)], {"einsum"}),
    ("...ij,...jk", [(2, 3, 4), (4, 2)], {"einsum"}),
])
def test_einsum_of_two_operands_is_a_matrix_multiply(equation, shapes, kinds):
    """A contraction of two operands converts to a matrix multiply between shuffles (what the backends fuse:
    attention, GEMM epilogues); a diagonal, an outer product or an ellipsis stays one einsum layer."""
    tensors = [torch.randn(*s) for s in shapes]
    traced = torch.jit.trace(Traced(lambda *ts: torch.einsum(equation, *ts)).eval(), tensors)
    data = torchkiln.convert_method_to_engine(traced, "forward", [torchkiln.Input(t.shape) for t in tensors],
                                              backend="reference", min_block_size=1)
    assert {layer.KIND for layer in Engine.deserialize(data).network.layers} == kinds


def test_einsum_with_dynamic_batch():
    """The batch subscript stays a dim of its own, so a dynamic batch needs no merged size."""
    w = torch.randn(4, 5)
    check_traced(lambda x: torch.einsum("bij,jk->bik", x, w), torch.randn(3, 2, 4),
                 inputs=[torchkiln.Input(min_shape=(1, 2, 4), opt_shape=(3, 2, 4), max_shape=(6, 2, 4))])


def einsum_with_constant(x):
    return torch.einsum("ij,jk->ik", [x, torch.ones(4, 2)])


def test_einsum_scripted_with_constant_operand():
    check_fn(einsum_with_constant, torch.randn(3, 4), op="aten::einsum")


def test_integer_matmul():
    check_traced(lambda a, b: torch.bmm(a, b), torch.randint(-5, 5, (2, 3, 4)), torch.randint(-5, 5, (2, 4, 2)),
                 op="aten::bmm")


NAN, INF = float("nan"), float("inf")


def _with_special(x):
    """x with NaN and +inf in its first two elements."""
    x = x.clone()
    x.view(-1)[:2] = torch.tensor([NAN, INF])
    return x


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("op", [torch.outer, torch.ger], ids=lambda v: v.__name__)
def test_outer(op, backend):
    check_traced(op, torch.tensor([1.0, NAN, INF, -INF, 0.0]), torch.tensor([2.0, 0.0, -1.0]), backend=backend)
    check_traced(op, torch.tensor([1, 2, -3]), torch.tensor([4, 5]), backend=backend)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("beta, alpha", [(1, 1), (0, 1), (0.5, 2.0), (0, -1.5)])
def test_addr_addmv(beta, alpha, backend):
    """beta * self + alpha * product; with beta == 0 the NaN and inf in self do not propagate (as eager)."""
    vec1, vec2 = torch.tensor([1.0, NAN, INF, -INF, 0.0]), torch.tensor([2.0, 0.0, -1.0])
    check_traced(lambda s, a, b: torch.addr(s, a, b, beta=beta, alpha=alpha), _with_special(torch.randn(5, 3)),
                 vec1, vec2, backend=backend)
    check_traced(lambda s, m, v: torch.addmv(s, m, v, beta=beta, alpha=alpha), _with_special(torch.randn(3)),
                 torch.randn(3, 4), torch.randn(4), backend=backend)


def test_addmv_broadcast_self():
    check_traced(lambda s, m, v: torch.addmv(s, m, v), torch.randn(1), torch.randn(3, 4), torch.randn(4))


def test_bilinear():
    w, b = torch.randn(4, 3, 5), torch.randn(4)
    check_traced(lambda x1, x2: torch.nn.functional.bilinear(x1, x2, w, b), torch.randn(2, 6, 3), torch.randn(2, 6, 5))
    check_traced(lambda x1, x2, w: torch.nn.functional.bilinear(x1, x2, w), torch.randn(6, 3), torch.randn(6, 5), w)


@pytest.mark.parametrize("shapes", [[(3, 4), (4, 5), (5, 2)], [(4,), (4, 5), (5,)], [(4,), (4, 2)], [(3, 4), (4,)]])
def test_linalg_multi_dot(shapes):
    check_traced(lambda *ts: torch.linalg.multi_dot(ts), *(torch.randn(*s) for s in shapes))
