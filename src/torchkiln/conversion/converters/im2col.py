"""im2col (torch.nn.functional.unfold) and col2im (fold).

im2col: every kernel tap's strided slice of the padded input, stacked after the channels, so output channel
c * kh * kw + i * kw + j holds tap (i, j) of channel c, as eager orders them. Slices move values unchanged (a
convolution with a one-hot weight would turn an infinity into NaN)."""
from __future__ import annotations

import torch

from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.errors import ConversionError
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import is_symbolic
from torchkiln.ir.tensor import Tensor


@converter("aten::im2col")
def im2col(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = args.kernel_size, args.dilation, args.padding, args.stride
    *lead, h, w = x.shape
    if is_symbolic(h) or is_symbolic(w):
        raise ConversionError("im2col of spatial dims known only at run time")
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if out_h < 1 or out_w < 1:
        raise ConversionError(f"im2col: a {kh}x{kw} kernel does not fit the padded {h}x{w} input")
    if ph or pw:
        x = ctx.network.add_padding(x, [pw, pw, ph, ph], L.PaddingMode.CONSTANT).get_output()
    keep = [0] * len(lead)
    taps = [reshape(ctx, ctx.network.add_slice(x, [*keep, i * dh, j * dw], [*lead, out_h, out_w],
                                                [*[1] * len(lead), sh, sw]).get_output(), [*lead, 1, out_h * out_w])
            for i in range(kh) for j in range(kw)]
    stacked = taps[0] if len(taps) == 1 else ctx.network.add_concatenation(taps, len(lead)).get_output()
    *batch, channels = lead
    return reshape(ctx, stacked, [*batch, channels * kh * kw, out_h * out_w])


def _placed(ctx: ConversionCtx, tap: Tensor, lead: list, offsets: tuple[int, int], size: tuple[int, int]
            ) -> Tensor | None:
    """A tap's [*lead, rows, cols] values (zero-stuffed for the stride) placed at `offsets` in a `size` map: the
    rows and columns outside it are sliced off, the rest of the map is zeros. None where nothing lands inside."""
    start, shape, before, after = [], [], [], []
    for offset, extent, total in zip(offsets, tap.shape[-2:], size):
        first, last = max(0, -offset), min(extent, total - offset)
        if last <= first:
            return None
        start.append(first)
        shape.append(last - first)
        before.append(first + offset)
        after.append(total - (first + offset) - (last - first))
    if shape != list(tap.shape[-2:]):
        tap = ctx.network.add_slice(tap, [0] * len(lead) + start, [*lead, *shape], [1] * (len(lead) + 2)).get_output()
    if any(before) or any(after):
        tap = ctx.network.add_padding(tap, [before[1], after[1], before[0], after[0]],
                                      L.PaddingMode.CONSTANT).get_output()
    return tap


@converter("aten::col2im")
def col2im(ctx: ConversionCtx, args: Args) -> Tensor:
    """col2im (torch.nn.functional.fold): the sum over kernel taps of each tap's values, zero-stuffed for the
    stride and placed at the tap's offset in the output, in tap order as eager sums them. Slices, padding with
    zeros and sums keep infinities and NaN where eager has them (a transposed convolution by one-hot weights would
    not)."""
    x = ctx.to_tensor(args.self)
    (h, w), (kh, kw) = args.output_size, args.kernel_size
    (dh, dw), (ph, pw), (sh, sw) = args.dilation, args.padding, args.stride
    *batch, rows, length = x.shape
    if any(is_symbolic(d) for d in (h, w, rows, length)):
        raise ConversionError("col2im of sizes known only at run time")
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if out_h < 1 or out_w < 1 or rows % (kh * kw) or out_h * out_w != length:
        raise ConversionError(f"col2im: [{rows}, {length}] columns do not fold into {h}x{w} with a {kh}x{kw} kernel")
    lead = [*batch, rows // (kh * kw)]
    taps = reshape(ctx, x, [*lead, kh * kw, out_h, out_w])
    total = None
    for i in range(kh):
        for j in range(kw):
            tap = ctx.network.add_slice(taps, [0] * len(lead) + [i * kw + j, 0, 0], [*lead, 1, out_h, out_w],
                                        [1] * (len(lead) + 3)).get_output()
            if sh > 1 or sw > 1:  # zero-stuffed: value (y, x) at (y * sh, x * sw)
                tap = reshape(ctx, tap, [*lead, out_h, 1, out_w, 1])
                tap = ctx.network.add_padding(tap, [0, sw - 1, 0, 0, 0, sh - 1], L.PaddingMode.CONSTANT).get_output()
            tap = reshape(ctx, tap, [*lead, out_h * sh, out_w * sw])
            placed = _placed(ctx, tap, lead, (i * dh - ph, j * dw - pw), (h, w))
            if placed is not None:
                total = placed if total is None else ctx.network.add_elementwise(
                    total, placed, L.ElementWiseOperation.SUM).get_output()
    if total is None:
        return ctx.to_tensor(torch.zeros([*lead, h, w], dtype=x.dtype))
    return total
