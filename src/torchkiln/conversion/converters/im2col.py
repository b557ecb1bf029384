"""im2col (torch.nn.functional.unfold): every kernel tap's strided slice of the padded input, stacked after the
channels, so output channel c * kh * kw + i * kw + j holds tap (i, j) of channel c, as eager orders them. Slices move
values unchanged (a convolution with a one-hot weight would turn an infinity into NaN)."""
from __future__ import annotations

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
