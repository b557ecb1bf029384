"""Pooling converters: avg_pool2d/3d against eager."""
import pytest
import torch
import torch.nn.functional as F
from harness import check_traced


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("pool, shape, divisor", [(F.avg_pool2d, (1, 2, 7, 6), -2), (F.avg_pool3d, (1, 2, 5, 6, 7), -3),
                                                  (F.avg_pool2d, (1, 2, 7, 6), 3)], ids=["2d -2", "3d -3", "2d 3"])
def test_avg_pool_divisor_override(pool, shape, divisor, backend):
    """torch divides by a negative divisor_override as given (OpInfo avg_pool2d/3d); the pooling layer takes
    divisors >= 1, so the conversion failed and the op fell back."""
    x = torch.randn(shape)
    op = f"aten::{pool.__name__}"
    check_traced(lambda t: pool(t, 3, 2, 1, True, False, divisor), x, op=op, backend=backend)
