"""Trapezoid-rule converters (conversion/converters/integrate.py) against eager: spacing as a 1-d or full tensor or a
number, cumulative forms, other dims, NaN and infinities."""
import pytest
import torch
from harness import check_traced


@pytest.mark.parametrize("name, fn", [
    ("trapezoid_x", lambda y, x: torch.trapezoid(y, x[0], dim=1)),
    ("trapezoid_x_full", lambda y, x: torch.trapezoid(y, x.expand(3, 5).contiguous() * 1.0)),
    ("trapz_dx", lambda y, x: torch.trapz(y, dx=0.5, dim=0) + x.sum()),
    ("trapezoid_dx", lambda y, x: torch.trapezoid(y, dx=2) + x.sum()),
    ("cumulative_x", lambda y, x: torch.cumulative_trapezoid(y, x[0])),
    ("cumulative_dx", lambda y, x: torch.cumulative_trapezoid(y, dx=0.3, dim=0) + x.sum()),
], ids=lambda v: v if isinstance(v, str) else "")
def test_trapezoid(name, fn):
    y, x = torch.randn(3, 5), torch.rand(1, 5).cumsum(1)
    check_traced(fn, y, x)
    y[1, 2], y[2, 0] = float("nan"), float("inf")
    check_traced(fn, y, x)
