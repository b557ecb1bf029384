"""Calibration's range algorithms (builder/ranges.py) on distributions whose answer is known, and per-channel weight
quantization against torch's own fake quantization."""
import math

import pytest
import torch

from torchkiln.builder.passes.quantize import quantize_weight
from torchkiln.builder.ranges import Histogram, choose_amax, fake_quantized
from torchkiln.enums import CalibrationAlgo
from torchkiln.ir.reference import dequantize

I8, F8 = torch.int8, torch.float8_e4m3fn


def _histogram(*batches: torch.Tensor) -> Histogram:
    hist = Histogram()
    for x in batches:
        hist.observe_max(x)
    for x in batches:
        hist.observe(x)
    return hist


def _gaussian(n: int = 400_000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _with_outliers() -> torch.Tensor:
    """N(0, 1) and a handful of values at 100: the range worth keeping is a few sigma, not 100."""
    return torch.cat([_gaussian(), torch.full((8,), 100.0)])


def _mse(x: torch.Tensor, amax: float, quant_type: torch.dtype) -> float:
    return float((fake_quantized(x, amax, quant_type) - x).double().pow(2).mean())


def test_max_is_the_largest_magnitude_over_every_batch():
    a, b = torch.tensor([0.5, -3.0, 1.0]), torch.tensor([2.0, float("nan"), float("inf"), -2.5])
    assert choose_amax(_histogram(a, b), CalibrationAlgo.MAX, I8) == 3.0  # NaN and inf are not ranges


def test_percentile_of_a_gaussian_is_its_quantile():
    amax = choose_amax(_histogram(_gaussian()), CalibrationAlgo.PERCENTILE, I8)
    expected = math.sqrt(2) * torch.erfinv(torch.tensor(0.9999, dtype=torch.float64)).item()  # P(|x| <= t) = 0.9999
    assert abs(amax - expected) < 0.08 * expected, (amax, expected)


@pytest.mark.parametrize("algo", [CalibrationAlgo.ENTROPY, CalibrationAlgo.PERCENTILE])
def test_outliers_do_not_set_the_range(algo):
    """Max keeps 100; entropy and percentile clip the outliers and keep a range of a few sigma (MSE keeps them:
    clipping eight values from 100 costs more squared error than the bulk's coarser steps)."""
    x = _with_outliers()
    hist = _histogram(x)
    assert choose_amax(hist, CalibrationAlgo.MAX, I8) == 100.0
    amax = choose_amax(hist, algo, I8)
    assert 2.0 < amax < 12.0, amax


@pytest.mark.parametrize("quant_type", [I8, F8])
def test_mse_range_has_the_least_squared_error_among_its_neighbours(quant_type):
    x = _with_outliers()
    amax = choose_amax(_histogram(x), CalibrationAlgo.MSE, quant_type)
    best = _mse(x, amax, quant_type)
    for other in (0.7 * amax, 1.4 * amax, 100.0):
        assert best <= _mse(x, other, quant_type) * 1.02, (amax, other)


def test_mse_range_of_a_gaussian_clips_its_tail():
    """The int8 MSE-optimal clipping of N(0, 1) is about 3.9 sigma (Banner et al., ACIQ), below its max (~4.9)."""
    x = _gaussian()
    amax = choose_amax(_histogram(x), CalibrationAlgo.MSE, I8)
    assert 3.3 < amax < 4.4 < float(x.abs().max()), amax


def test_entropy_range_of_a_gaussian_is_a_few_sigma():
    """TensorRT's entropy calibration keeps about 3-5 sigma of a normal distribution (not its 4.9-sigma max)."""
    amax = choose_amax(_histogram(_gaussian()), CalibrationAlgo.ENTROPY, I8)
    assert 2.5 < amax < 5.0, amax


def test_zero_tensor_has_range_zero_and_scale_one():
    hist = _histogram(torch.zeros(10))
    assert choose_amax(hist, CalibrationAlgo.ENTROPY, I8) == 0.0
    assert torch.equal(fake_quantized(torch.zeros(3), 0.0, I8), torch.zeros(3))


@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_weights_match_torch_fake_quantize(axis):
    w = torch.randn(6, 5, 3, generator=torch.Generator().manual_seed(1)) * torch.tensor([0.1, 1, 5, 20, 0.01])[
        None, :, None].expand(6, 5, 3).movedim(1, axis if axis == 1 else 0).reshape(6, 5, 3)
    q, scale = quantize_weight(w, axis, I8)
    shape = [-1 if d == axis else 1 for d in range(3)]
    assert q.dtype == I8 and int(q.abs().max()) == 127
    expected = torch.fake_quantize_per_channel_affine(w, scale, torch.zeros(scale.shape, dtype=torch.int32), axis,
                                                      -128, 127)
    assert torch.equal(dequantize(q, scale.reshape(shape), None), expected)
    assert torch.equal(scale, w.abs().amax(dim=[d for d in range(3) if d != axis]) / 127)


def test_fp8_weights_keep_each_channel_to_its_largest_value():
    w = torch.randn(4, 16, generator=torch.Generator().manual_seed(2)) * torch.tensor([[1e-3], [1.0], [1e2], [1e4]])
    q, scale = quantize_weight(w, 0, F8)
    back = dequantize(q, scale.reshape(-1, 1), None)
    assert torch.equal(back.abs().amax(1), w.abs().amax(1))  # 448 * scale is each channel's largest value
    assert float(((back - w).abs() / w.abs().amax(1, keepdim=True)).max()) < 2 ** -4  # 3 mantissa bits
