"""Convolution and pooling converters through the whole pipeline: transposed convolutions (scripted and
traced), string padding as tracing records it, unbatched inputs, adaptive max pooling, pools that also return indices."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import assert_falls_back, check_compiled, check_fn, check_traced

_TRANSPOSED = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_SPATIAL = {1: (7,), 2: (6, 5), 3: (4, 5, 3)}


class Wrapped(nn.Module):
    """forward(x) = inner(x): nn.ConvTranspose*d's forward has an optional output_size argument."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("kw", [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, output_padding=1),
    dict(kernel_size=2, stride=3, padding=1, output_padding=2, dilation=2),
    dict(kernel_size=3, stride=2, padding=1, groups=2, bias=False),
], ids=["plain", "stride-outpad", "pad-dilation", "groups-nobias"])
@pytest.mark.parametrize("how", ["scripted", "traced"])
def test_conv_transpose(nd, kw, how):
    conv = _TRANSPOSED[nd](4, 6, **kw)
    x = torch.randn(2, 4, *_SPATIAL[nd])
    if how == "traced":  # tracing records aten::_convolution(transposed=True)
        check_traced(conv, x, op="aten::_convolution")
    else:
        key = "aten::conv_transpose1d" if nd == 1 else f"aten::conv_transpose{nd}d.input"
        _, report = check_compiled(Wrapped(conv), [x], min_block_size=1)
        assert report.blocks[0].ops == (key,)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("padding,kw", [
    ("same", dict()),
    ("same", dict(dilation=2)),
    ("same", dict(groups=2)),
    ("valid", dict(stride=2)),
], ids=["same", "same-dilation", "same-groups", "valid-stride"])
def test_string_padding_traced(nd, padding, kw):
    """Tracing records a string-padded convolution as aten::_convolution_mode; "same" pads an even kernel more
    at the end, as torch does."""
    torch.manual_seed(0)
    w, b = torch.randn(6, 4 // kw.get("groups", 1), *((4, 3, 2)[:nd])), torch.randn(6)
    check_traced(lambda x: _CONV[nd](x, w, b, padding=padding, **kw), torch.randn(2, 4, *_SPATIAL[nd]),
                 op="aten::_convolution_mode")


def conv_transpose_unbatched(x):
    return F.conv_transpose1d(x, torch.ones(3, 2, 3), stride=2)


def conv1d_unbatched(x):
    return F.conv1d(x, torch.ones(2, 3, 3), padding=1)


@pytest.mark.parametrize("fn,op", [(conv_transpose_unbatched, "aten::conv_transpose1d"),
                                   (conv1d_unbatched, "aten::conv1d")])
def test_unbatched_convolution_input(fn, op):
    check_fn(fn, torch.randn(3, 8), op=op)


def test_conv_transpose_non_contiguous_input():
    w = torch.randn(4, 2, 3, 3)
    check_traced(lambda x: F.conv_transpose2d(x.transpose(2, 3), w, stride=2), torch.randn(1, 4, 5, 6),
                 op="aten::_convolution")


@pytest.mark.parametrize("nd,out", [(1, 3), (1, 7), (2, (3, 4)), (2, (1, 1)), (2, (4, None)), (3, (2, 3, 2))])
def test_adaptive_max_pool(nd, out):
    pool = {1: nn.AdaptiveMaxPool1d, 2: nn.AdaptiveMaxPool2d, 3: nn.AdaptiveMaxPool3d}[nd](out)
    x = torch.randn(2, 3, *(7, 6, 5)[:nd])
    _, report = check_compiled(pool, [x], min_block_size=1)
    assert report.blocks[0].ops == (f"aten::adaptive_max_pool{nd}d",)


def test_adaptive_max_pool_nan_propagates():
    x = torch.randn(1, 2, 6, 6)
    x[0, 1, 2, 3] = float("nan")
    check_traced(lambda t: F.adaptive_max_pool2d(t, (4, 3)), x, op="aten::adaptive_max_pool2d")


@pytest.mark.parametrize("kw", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True)],
                         ids=["padded", "ceil"])
def test_max_pool_nan_propagates(kw):
    """ONNX Runtime's MaxPool skips NaN; eager's max pooling returns it for every window that holds one."""
    x = torch.randn(1, 2, 7, 7)
    x[0, 0, 0, 0], x[0, 1, 3, 4], x[0, 1, 6, 6] = float("nan"), float("nan"), float("inf")
    check_traced(lambda t: F.max_pool2d(t * 2, **kw), x, op="aten::max_pool2d")


def adaptive_max_pool_values(x):
    return F.adaptive_max_pool2d_with_indices(x, [3, 2])[0] * 2


def adaptive_max_pool_indices(x):
    return F.adaptive_max_pool2d(x, [3, 2], return_indices=True)


def max_pool_values(x):
    return F.max_pool2d(x, [2, 2], [2, 1], return_indices=True)[0] + 1


def max_pool_indices(x):
    return F.max_pool2d(x, [2, 2], [2, 1], return_indices=True)


def test_pool_with_unused_indices_converts():
    x = torch.randn(2, 3, 6, 5)
    check_fn(adaptive_max_pool_values, x, op="aten::adaptive_max_pool2d")
    check_fn(max_pool_values, x, op="aten::max_pool2d_with_indices")


@pytest.mark.parametrize("fn,op", [(adaptive_max_pool_indices, "aten::adaptive_max_pool2d"),
                                   (max_pool_indices, "aten::max_pool2d_with_indices")])
def test_pool_with_used_indices_falls_back(fn, op):
    _, report = check_fn(fn, torch.randn(2, 3, 6, 5), engines=0, torch_blocks=1)
    assert_falls_back(report, op, "indices output is used")


@pytest.mark.parametrize("nd", [1, 3])
def test_max_pool_with_indices_1d_3d(nd):
    x = torch.randn(2, 3, *(8, 6, 4)[:nd])
    fn = F.max_pool1d if nd == 1 else F.max_pool3d
    check_traced(lambda t: fn(t, 2, return_indices=True)[0], x, op=f"aten::max_pool{nd}d_with_indices")


@pytest.mark.parametrize("nd", [2, 3])
def test_max_pool_of_minus_inf_windows_is_minus_inf(nd):
    """ONNX Runtime's 3-d MaxPool gives float32's lowest value for a window of -inf only; eager gives -inf (OpInfo
    adaptive_max_pool3d with special values)."""
    x = torch.randn(1, 4, *(4, 3, 5)[3 - nd:])
    x.view(-1)[0], x.view(-1)[30], x.view(-1)[50] = float("nan"), float("-inf"), float("inf")
    pool = {2: F.max_pool2d, 3: F.max_pool3d}[nd]
    check_traced(lambda t: pool(t, 1), x, op=f"aten::max_pool{nd}d")
    check_traced(lambda t: pool(t, 1), x.nan_to_num(0.0, posinf=1.0), op=f"aten::max_pool{nd}d")
