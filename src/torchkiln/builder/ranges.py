"""Post-training quantization's range finding: the amax (largest magnitude kept) of an activation from its
calibration values, by one of the `CalibrationAlgo` algorithms over a histogram of |value|, and the scales of
weights per output channel.

Values come in two passes, as TensorRT's calibrators take them: the first finds each tensor's largest |value|,
the second counts |value| in `BINS` bins over [0, that]; the algorithms choose a bin edge as the amax."""
from __future__ import annotations

import dataclasses
import math

import torch

from torchkiln.enums import CalibrationAlgo
from torchkiln.ir import layers as L
from torchkiln.ir.reference import dequantize, quantize

BINS = 2048
PERCENTILE = 99.99
KL_LEVELS = 128  # int8's positive levels: the entropy algorithm's quantized histogram has this many bins
KL_STRIDE = 8  # candidate thresholds every this many bins


@dataclasses.dataclass
class Histogram:
    """|value| counts of one tensor over its calibration values: `observe_max` in the first pass, `observe` in the
    second."""

    amax: float = 0.0
    counts: torch.Tensor | None = None

    def observe_max(self, x: torch.Tensor) -> None:
        if x.numel():
            self.amax = max(self.amax, float(_finite_magnitudes(x).max()))

    def observe(self, x: torch.Tensor) -> None:
        if self.amax == 0:
            return
        values = _finite_magnitudes(x)
        if values.is_cuda and torch.are_deterministic_algorithms_enabled():  # CUDA's histc counts with atomics
            values = values.cpu()
        # counted where the values are (not copied to the host: a GPU calibration's activations are large), each
        # call's counts exact (under 2**24 a bin) and summed in float64 on the host
        counts = torch.histc(values, BINS, 0.0, self.amax).cpu().double()  # the -1s lie outside: not counted
        self.counts = counts if self.counts is None else self.counts + counts

    @property
    def width(self) -> float:
        return self.amax / BINS


def _finite_magnitudes(x: torch.Tensor) -> torch.Tensor:
    """|x| where finite, -1 where not (NaN and inf are not ranges)."""
    x = x.detach().float().abs()
    return torch.where(torch.isfinite(x), x, -1.0)


UNSIGNED_ZERO = -128  # the int8 zero point of a range [0, amax] (uint8's 0: ONNX Runtime then drops a ReLU before it)


def fake_quantized(x: torch.Tensor, amax: float, quant_type: torch.dtype, unsigned: bool = False) -> torch.Tensor:
    """`x` through a per-tensor quantizer of range `amax` as calibration places it (dividing by the scale):
    symmetric, or over [0, amax] where `unsigned` (int8)."""
    scale = torch.tensor(scale_of(amax, quant_type, unsigned))
    zero = torch.tensor(UNSIGNED_ZERO) if unsigned else None
    return dequantize(quantize(x, scale, zero, quant_type, divide=True), scale, zero)


def scale_of(amax: float | torch.Tensor, quant_type: torch.dtype, unsigned: bool = False,
             top: int | None = None) -> float | torch.Tensor:
    """The symmetric scale that maps amax to the type's largest value (int8: 127, fp8 e4m3: 448; `top` instead where
    given), or with `unsigned` (int8, zero point `UNSIGNED_ZERO`) the scale that maps [0, amax] to all 256 levels; a
    zero amax (a tensor of zeros) gets scale 1."""
    lo, hi = L.QUANT_RANGE[quant_type]
    hi = hi - lo if unsigned else top or hi
    if isinstance(amax, torch.Tensor):
        return torch.where(amax > 0, amax / hi, torch.ones_like(amax)).float()
    return amax / hi if amax > 0 else 1.0


def choose_amax(hist: Histogram, algo: CalibrationAlgo, quant_type: torch.dtype) -> float:
    """The range `algo` keeps for the values `hist` counted."""
    if algo == CalibrationAlgo.MAX or hist.counts is None or hist.amax == 0:
        return hist.amax
    counts = hist.counts.double()
    if algo == CalibrationAlgo.PERCENTILE:
        cumulative = counts.cumsum(0) / counts.sum()
        k = int(torch.searchsorted(cumulative, torch.tensor(PERCENTILE / 100, dtype=torch.float64)))
        return min(k + 1, BINS) * hist.width
    if algo == CalibrationAlgo.MSE:
        return _least_mse(counts, hist.width, quant_type)
    return _least_divergence(counts, hist.width)


def _least_mse(counts: torch.Tensor, width: float, quant_type: torch.dtype) -> float:
    """The bin edge whose quantizer has the least squared error over the bin centres, weighted by their counts."""
    centres = (torch.arange(BINS, dtype=torch.float64) + 0.5) * width
    best, best_error = BINS * width, math.inf
    for k in range(KL_LEVELS, BINS + 1, KL_STRIDE):
        amax = k * width
        error = float((counts * (centres - fake_quantized(centres.float(), amax, quant_type).double()) ** 2).sum())
        if error < best_error:
            best, best_error = amax, error
    return best


def _least_divergence(counts: torch.Tensor, width: float) -> float:
    """TensorRT's entropy calibration (as MXNet and ModelOpt write it): for each threshold of i bins, P is the
    histogram clipped there with the tail added to its last bin, Q the clipped histogram without the tail merged
    into KL_LEVELS levels, each level's count spread over the bins where P is not empty; the threshold of least
    KL(P || Q), with Q's empty bins smoothed (SMOOTHING taken from its others)."""
    best, best_divergence = BINS * width, math.inf
    for i in range(KL_LEVELS, BINS + 1, KL_STRIDE):
        p = counts[:i].clone()
        p[-1] += counts[i:].sum()
        nonzero = (p > 0).double()
        group = torch.arange(i) * KL_LEVELS // i  # the level each bin merges into
        level_sums = torch.zeros(KL_LEVELS, dtype=torch.float64).index_add_(0, group, counts[:i])
        level_bins = torch.zeros(KL_LEVELS, dtype=torch.float64).index_add_(0, group, nonzero)
        q = nonzero * level_sums[group] / level_bins[group].clamp(min=1)
        divergence = _divergence(p, q)
        if divergence < best_divergence:
            best, best_divergence = (i + 0.5) * width, divergence
    return min(best, BINS * width)


SMOOTHING = 1e-4


def _divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(P || Q) of two histograms of counts, Q's empty bins given SMOOTHING counts (taken evenly from its
    others), then both normalized."""
    empty = q == 0
    filled = int((~empty).sum())
    if filled == 0:
        return math.inf
    q = torch.where(empty, SMOOTHING, q - SMOOTHING * int(empty.sum()) / filled)
    keep = p > 0
    p, q = p[keep] / p.sum(), q[keep] / q.sum()
    return float((p * torch.log(p / q)).sum())


def channel_amax(weight: torch.Tensor, axis: int) -> torch.Tensor:
    """The largest |value| of each slice of `weight` along `axis` (per output channel)."""
    moved = weight.detach().float().movedim(axis, 0).abs()
    if not moved.numel():
        return torch.zeros(moved.shape[0], device=weight.device)
    return moved.reshape(moved.shape[0], -1).amax(1)
