"""Resize converters through the whole pipeline: F.interpolate in every mode by size and by scale factor
(integer, fractional, per dim), the upsample_* overloads with explicit scales, and grid sampling."""
import pytest
import torch
import torch.nn.functional as F
from harness import assert_falls_back, assert_matches_eager, check_fn, check_traced

_SHAPES = {1: (2, 3, 7), 2: (2, 3, 5, 7), 3: (1, 2, 3, 4, 5)}
_MODES = [("nearest", 1), ("nearest", 2), ("nearest", 3), ("nearest-exact", 1), ("nearest-exact", 2),
          ("nearest-exact", 3), ("linear", 1), ("bilinear", 2), ("bicubic", 2), ("trilinear", 3)]
_OPS = {"nearest": "upsample_nearest", "nearest-exact": "_upsample_nearest_exact", "linear": "upsample_linear",
        "bilinear": "upsample_bilinear", "bicubic": "upsample_bicubic", "trilinear": "upsample_trilinear"}


def _check(fn, *example: torch.Tensor, mode: str, nd: int) -> None:
    """check_traced, and the engine runs the upsample op of `mode` (traces record .vec or plain overloads)."""
    _, report = check_traced(fn, *example)
    assert any(op.startswith(f"aten::{_OPS[mode]}{nd}d") for op in report.blocks[0].ops), report


_INTERPOLATE = [(m, nd, ac) for m, nd in _MODES for ac in ((None,) if "nearest" in m else (False, True))]


@pytest.mark.parametrize("mode,nd,align_corners", _INTERPOLATE, ids=[f"{m}-{n}d-{a}" for m, n, a in _INTERPOLATE])
@pytest.mark.parametrize("how", [dict(scale_factor=2.0), dict(scale_factor=1.7), dict(scale_factor=0.6),
                                 dict(size=9)], ids=["scale2", "scale1.7", "scale0.6", "size"])
def test_interpolate(mode, nd, align_corners, how):
    fn = lambda x: F.interpolate(x, mode=mode, align_corners=align_corners, **how)  # noqa: E731
    _check(fn, torch.randn(*_SHAPES[nd]), mode=mode, nd=nd)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_per_dim_scales_and_sizes(mode):
    x = torch.randn(*_SHAPES[2])
    _check(lambda t: F.interpolate(t, scale_factor=(1.5, 0.75), mode=mode), x, mode=mode, nd=2)
    _check(lambda t: F.interpolate(t, size=(3, 11), mode=mode), x, mode=mode, nd=2)


def test_interpolate_non_contiguous_input():
    _check(lambda x: F.interpolate(x.transpose(2, 3), scale_factor=1.3, mode="bilinear"), torch.randn(*_SHAPES[2]),
           mode="bilinear", nd=2)


def nearest_by_consistent_scales(x):
    return torch.ops.aten.upsample_nearest2d(x, [12, 17], 2.5, 2.5)


def bilinear_by_size(x):
    return torch.ops.aten.upsample_bilinear2d(x, [8, 11], False)


def bilinear_by_scales(x):
    return torch.ops.aten.upsample_bilinear2d(x, [8, 11], False, 1.7, 1.7)


def bicubic_by_scales(x):
    return torch.ops.aten.upsample_bicubic2d(x, [3, 4], False, 0.75, 0.6)


PLAIN = [(nearest_by_consistent_scales, "aten::upsample_nearest2d"), (bilinear_by_size, "aten::upsample_bilinear2d"),
         (bilinear_by_scales, "aten::upsample_bilinear2d"), (bicubic_by_scales, "aten::upsample_bicubic2d")]


@pytest.mark.parametrize("fn,op", PLAIN, ids=[f.__name__ for f, _ in PLAIN])
def test_upsample_overloads_with_explicit_scales(fn, op):
    check_fn(fn, torch.randn(*_SHAPES[2]), op=op)


def test_upsample_1d_3d_overloads():
    check_traced(lambda x: torch.ops.aten.upsample_linear1d(x, [9], True, 1.7), torch.randn(*_SHAPES[1]),
                 op="aten::upsample_linear1d")
    check_traced(lambda x: torch.ops.aten._upsample_nearest_exact1d(x, [10]), torch.randn(*_SHAPES[1]),
                 op="aten::_upsample_nearest_exact1d")
    check_traced(lambda x: torch.ops.aten.upsample_trilinear3d(x, [3, 8, 10], False, 1.0, 2.0, 2.0),
                 torch.randn(*_SHAPES[3]), op="aten::upsample_trilinear3d")


def bilinear_size_and_scales_disagree(x):
    return torch.ops.aten.upsample_bilinear2d(x, [9, 11], False, 1.7, 1.7)


def test_upsample_whose_size_and_scales_disagree_falls_back():
    _, report = check_fn(bilinear_size_and_scales_disagree, torch.randn(*_SHAPES[2]), engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::upsample_bilinear2d", "these scales do not give this size")


@pytest.mark.parametrize("mode,nd,align_corners", [("linear", 1, False), ("bilinear", 2, True), ("bicubic", 2, False),
                                                   ("trilinear", 3, True)])
def test_interpolate_of_nan_and_inf_matches_eager(mode, nd, align_corners):
    """NaN and inf propagate through torch's weighted sums (0 * inf is NaN) otherwise than through ONNX Runtime's
    Resize: an onnxruntime engine computes such a call on the reference meanings."""
    x = torch.randn(_SHAPES[nd]).view(-1)
    x[3], x[10], x[17] = float("nan"), float("inf"), float("-inf")
    fn = lambda t: F.interpolate(t * 2, scale_factor=2.0, mode=mode, align_corners=align_corners)  # noqa: E731
    compiled, _ = check_traced(fn, x.view(_SHAPES[nd]))
    assert_matches_eager(compiled(torch.ones(_SHAPES[nd])), fn(torch.ones(_SHAPES[nd])))  # and finite ones after


_GRID_2D = [(m, p) for m in ("bilinear", "nearest", "bicubic") for p in ("zeros", "border", "reflection")]


@pytest.mark.parametrize("mode,padding", _GRID_2D, ids=[f"{m}-{p}" for m, p in _GRID_2D])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d(mode, padding, align_corners):
    grid = torch.rand(2, 4, 5, 2) * 2.4 - 1.2  # some samples fall outside, where padding matters
    check_traced(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align_corners),
                 torch.randn(2, 3, 6, 7), grid, op="aten::grid_sampler")


@pytest.mark.parametrize("mode,padding", [("nearest", "reflection"), ("bilinear", "border"), ("bicubic", "zeros")])
def test_grid_sample_of_far_or_non_finite_coordinates_matches_eager(mode, padding):
    grid = torch.rand(2, 4, 5, 2) * 2 - 1
    grid[0, 0, :4, 0] = torch.tensor([1e5, -3e7, float("nan"), float("inf")])
    check_traced(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=False),
                 torch.randn(2, 3, 6, 7), grid, op="aten::grid_sampler")


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d_with_constant_grid(mode):
    grid = torch.rand(1, 2, 3, 4, 3) * 2 - 1
    check_traced(lambda x: F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False),
                 torch.randn(1, 2, 4, 5, 6), op="aten::grid_sampler")
