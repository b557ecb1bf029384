"""Shape analysis (torchkiln.analysis.shape_analysis): random example inputs outside an op's domain do not fail the
compile where shapes do not depend on values (they are inferred shape-only); where they do, the error says so."""
import pytest
import torch

import torchkiln
from harness import check_compiled, wrap


def _cholesky(x):
    return torch.linalg.cholesky(x) * 2


def _bce(x, y):
    return torch.nn.functional.binary_cross_entropy(x, y, reduction="none") + 1


def _quantile(x, q):
    return torch.quantile(x, q, dim=1) - 1


def _segment_reduce(x, lengths):
    return torch.segment_reduce(x, "sum", lengths=lengths) * 3


def _embedding_bag(weight, indices, offsets):
    return torch.nn.functional.embedding_bag(indices, weight, offsets, mode="max") + 1


def _spd(n):
    a = torch.randn(n, n)
    return a @ a.T + n * torch.eye(n)


@pytest.mark.parametrize("fn, example", [
    (_cholesky, lambda: (_spd(4),)),  # random N(0, 1) matrices are not positive definite
    (_bce, lambda: (torch.rand(3, 4), torch.rand(3, 4))),  # outside [0, 1]
    (_quantile, lambda: (torch.randn(3, 7), torch.tensor([0.1, 0.5, 0.9]))),  # q outside [0, 1]
    (_segment_reduce, lambda: (torch.randn(6, 2), torch.tensor([2, 4]))),  # lengths of ones do not sum to 6
    (_embedding_bag, lambda: (torch.randn(10, 3), torch.tensor([1, 7, 3, 2]), torch.tensor([0, 3]))),
], ids=["cholesky", "binary_cross_entropy", "quantile", "segment_reduce", "embedding_bag"])
def test_values_outside_the_op_domain_infer_shapes_only(fn, example):
    example = example()
    specs = [torchkiln.Input(tuple(t.shape), dtype=t.dtype) for t in example]  # shapes only: random values
    check_compiled(torch.jit.script(wrap(fn, len(example))), example, inputs=specs, engines=None,
                   torch_blocks=None, min_block_size=1)


def test_values_that_decide_a_check_fail_with_the_inputs_named():
    def cov(x, w):
        return torch.cov(x, aweights=w)  # its check reads the weights' values: no shape-only answer

    with pytest.raises(ValueError, match=r"aweights cannot be negative.*tensor_domain"):
        torchkiln.compile(torch.jit.script(wrap(cov, 2)), inputs=[torchkiln.Input((3, 5)), torchkiln.Input((5,))])
    compiled = torchkiln.compile(torch.jit.script(wrap(cov, 2)),
                                 inputs=[torchkiln.Input((3, 5)), torchkiln.Input((5,), tensor_domain=(0.0, 1.0))])
    x, w = torch.randn(3, 5), torch.rand(5)
    torch.testing.assert_close(compiled(x, w), torch.cov(x, aweights=w))
