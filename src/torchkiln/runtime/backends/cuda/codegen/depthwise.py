"""A Triton depthwise 2-D convolution with its bias and a pointwise epilogue in one kernel.

A depthwise convolution (one group per channel, one output channel per group) is memory-bound, and its input is
read once per tap: cuDNN's kernels reload it (a 7x7 at [32,192,56,56] fp16: 138 us on an H100, where its
traffic needs 26) and then a separate pass reads the output again for the bias and activation. Here a program
computes `rows` output rows of one image by `BLOCK_W` columns by `BLOCK_C` channels; channels are the fast axis,
so in channels-last memory every load and store is a contiguous vector. The program loops over the input rows its
output rows read; the kernel's columns are unrolled in the source, and each input row is loaded once per kernel
column and added to every output row it reaches (a 7x7 over 4 rows loads 10 input rows, not 28), so rows cut the
loads (and their conversions) per output. Window, stride, padding, dilation and rows are compile-time constants
of the source; sizes are run-time ints. Products accumulate in float32; the bias is added in float32 and the sum
rounded to the convolution's dtype before the epilogue (codegen/epilogue.py) reads it, as the library's output
tensor is. The output is channels-last; an input in another layout is laid out channels-last first.

Tile sizes are a tactic (`Config`): the planner times a few against the library step (the convolution followed by
the pointwise kernel), at the opt shape, and keeps the fastest.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen import PDL_PARAM, WAIT_LINES, chain_options, epilogue, launch
from torchkiln.runtime.backends.cuda.codegen.pointwise import HEADER, Builder

KERNEL_NAME = "depthwise_kernel"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
M_DIMS, N_DIM = (0, 2, 3), 1
FILL = 512  # programs a launch should have at least to fill a large GPU (an H100 has 132 SMs)
MIN_TILE = 256  # outputs a program computes at least (below, launch and index costs dominate)


@dataclasses.dataclass(frozen=True)
class Config:
    """One tile: output rows, columns and channels per program, and warps."""

    rows: int
    block_w: int
    block_c: int
    warps: int

    def text(self) -> str:
        return ",".join(str(v) for v in dataclasses.astuple(self))

    @classmethod
    def parse(cls, text: str) -> Config:
        try:
            config = cls(*(int(v) for v in text.split(",")))
        except (ValueError, TypeError):
            config = None
        if config is None or config.rows < 1 or config.warps < 1 or \
                any(v < 1 or v & (v - 1) for v in (config.block_w, config.block_c)):
            raise NetworkError(f"malformed depthwise tile configuration {text!r}")
        return config


def candidates(batch: int, channels: int, out_h: int, out_w: int) -> list[Config]:
    """The tiles worth timing for an output of [batch, channels, out_h, out_w]: one, two and four output rows a
    program (more rows reuse more of each loaded input row, fewer leave more programs), each as wide as the
    output up to 16 columns and 64 channels, narrowed until the launch has `FILL` programs or the tile is
    `MIN_TILE` outputs. Three compiles a layer in a cold build."""
    block_c, block_w = min(64, _pow2(channels)), min(16, _pow2(out_w))
    found: list[Config] = []
    for rows in (1, 2, 4):
        config = _fill(Config(min(rows, out_h), block_w, block_c, 4), batch, channels, out_h, out_w)
        if config not in found:
            found.append(config)
    return found


def _fill(config: Config, batch: int, channels: int, out_h: int, out_w: int) -> Config:
    """`config` narrowed (rows first, then columns, then channels) until its launch has `FILL` programs or its
    tile has `MIN_TILE` outputs; warps by the tile's size (8 fp16 values a thread at 4 warps and 1024 outputs)."""
    while _programs(config, batch, channels, out_h, out_w) < FILL and \
            config.rows * config.block_w * config.block_c > MIN_TILE:
        if config.rows > 1:
            config = dataclasses.replace(config, rows=config.rows // 2)
        elif config.block_w > 4:
            config = dataclasses.replace(config, block_w=config.block_w // 2)
        elif config.block_c > 16:
            config = dataclasses.replace(config, block_c=config.block_c // 2)
        else:
            break
    tile = config.rows * config.block_w * config.block_c
    return dataclasses.replace(config, warps=max(1, min(4, tile // 256)))


def _programs(config: Config, batch: int, channels: int, out_h: int, out_w: int) -> int:
    return batch * _cdiv(out_h, config.rows) * _cdiv(out_w, config.block_w) * _cdiv(channels, config.block_c)


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def depthwise_layer(layer: L.Layer) -> str | None:
    """None if `layer` is a convolution this kernel computes (2-D, one group per channel and one output channel per
    group, float32 or half precision); else why not."""
    if not isinstance(layer, L.ConvolutionLayer):
        return f"{layer.KIND} is not a convolution"
    w, x, out = layer.weights["kernel"], layer.inputs[0], layer.outputs[0]
    if out.dtype not in DTYPES or x.dtype != out.dtype:
        return f"dtype {out.dtype}: generated depthwise convolutions are float32 or half precision"
    if layer.transposed or w.dim() != 4 or x.rank != 4 or w.shape[1] != 1 or layer.groups != w.shape[0] or \
            x.shape[1] != w.shape[0]:
        return "only a 2-D convolution of one group per channel and one output channel per group"
    return None


@dataclasses.dataclass(frozen=True)
class DepthwiseKernel:
    """Generated source and what its launcher binds (as `gemm.GemmKernel`): the epilogue's other inputs, the weights
    it reads and its outputs."""

    source: str
    inputs: tuple[Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    outputs: tuple[Tensor, ...]


@dataclasses.dataclass(frozen=True)
class _Window:
    """A convolution's window, stride, padding and dilation (height, width)."""

    size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]

    @classmethod
    def of(cls, conv: L.ConvolutionLayer) -> _Window:
        def pair(values, default: int) -> tuple[int, int]:
            values = tuple(values) if values else (default,)
            return (values[0], values[-1])

        return cls(tuple(conv.weights["kernel"].shape[2:]), pair(conv.stride, 1), pair(conv.padding, 0),
                   pair(conv.dilation, 1))

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        return tuple(((size + 2 * p - d * (k - 1) - 1) // s) + 1 for size, k, s, p, d in
                     zip((h, w), self.size, self.stride, self.padding, self.dilation))


def generate(conv: L.Layer, layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
             rows: int = 1) -> DepthwiseKernel:
    """The kernel computing `outputs` from the convolution's output through the pointwise `layers` (the
    convolution's output is their first layer's input; `inputs` are the epilogue's other inputs), `rows` output
    rows a program."""
    why = depthwise_layer(conv)
    if why is not None:
        raise NetworkError(f"{conv.KIND} layer {conv.name!r} is not a generated depthwise convolution: {why}")
    b = epilogue.build(conv.outputs[0], layers, inputs, outputs)
    params = ["x", "w", "bias", *epilogue.pointer_params(b, outputs), "C", "H", "W", "OH", "OW",
              "x_sn", "x_sc", "x_sh", "x_sw", *epilogue.stride_params(b, outputs),
              "HAS_BIAS: tl.constexpr", "EVEN_C: tl.constexpr", "BLOCK_W: tl.constexpr", "BLOCK_C: tl.constexpr",
              PDL_PARAM]
    body = [*WAIT_LINES] + _taps(_Window.of(conv), rows) + _stores(b, outputs, rows)
    signature = ",\n        ".join(params)
    source = (f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}\n\n"
              f"@triton.jit(do_not_specialize=['H', 'W', 'OH', 'OW'])\ndef {KERNEL_NAME}(\n        {signature},\n):\n"
              + "".join(f"    {line}\n" for line in body))
    return DepthwiseKernel(source, tuple(inputs), tuple(b.weights), tuple(outputs))


def _taps(win: _Window, rows: int) -> list[str]:
    """Kernel lines from the program's place to the float32 accumulators `acc0`.. of its output rows."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = win.size, win.stride, win.padding, win.dilation
    lines = [
        "pid = tl.program_id(0)",
        "w_blocks = (OW + BLOCK_W - 1) // BLOCK_W",
        f"h_blocks = (OH + {rows - 1}) // {rows}",
        "ow = (pid % w_blocks) * BLOCK_W + tl.arange(0, BLOCK_W)",
        f"oh0 = ((pid // w_blocks) % h_blocks) * {rows}",
        "n = (pid // w_blocks // h_blocks).to(tl.int64)",
        "rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
        "if EVEN_C:",  # every channel block full: masks constant along the channels (whole-vector accesses)
        "    c_ok = tl.full((1, BLOCK_C), 1, tl.int1)",
        "else:",
        "    c_ok = (rc < C)[None, :]",
        "in_w = ow < OW",
        "x_img = x + n * x_sn",  # int64 to the image; int32 inside it (the launcher checks it fits)
        "x_c = (rc * x_sc)[None, :]",
        "w_c = w + rc[None, :]",
        "top = oh0 + tl.full((1, 1), 0, tl.int32)",  # a row as a tile (the interpreter masks by tiles only)
    ]
    for j in range(kw):  # each kernel column's input columns: offsets and bounds, shared by every row
        lines += [f"iw{j} = ow * {sw} + {j * dw - pw}",
                  f"col{j} = (iw{j} * x_sw)[:, None]",
                  f"ok{j} = ((iw{j} >= 0) & (iw{j} < W) & in_w)[:, None]"]
    lines += [f"acc{r} = tl.full((BLOCK_W, BLOCK_C), 0.0, tl.float32)" for r in range(rows)]
    # A loop over the input rows the program's output rows read (not unrolled: an unrolled 7x7 window keeps its 49
    # loads in flight at once, 255 registers and spills on sm_90); each kernel column's load is shared by every
    # output row it reaches, which adds it with that row's tap.
    lines += [f"for i in range({(rows - 1) * sh + (kh - 1) * dh + 1}):",
              f"    ih = top * {sh} + (i - {ph})",
              "    x_row = x_img + ih * x_sh",
              "    row_ok = (ih >= 0) & (ih < H)"]
    lines += [f"    xv{j} = tl.load(x_row + col{j} + x_c, mask=ok{j} & row_ok & c_ok, other=0.0).to(tl.float32)"
              for j in range(kw)]
    for r in range(rows):
        tap = f"(i - {r * sh})" if r * sh else "i"  # the kernel row times the dilation, where this row reaches
        reach = ([f"({tap} >= 0)"] if r * sh else []) + ([f"({tap} < {(kh - 1) * dh + 1})"] if r < rows - 1 else []) \
            + ([f"({tap} % {dh} == 0)"] if dh > 1 else [])
        indent = "    "
        if reach:
            lines.append(f"    if {' & '.join(reach)}:")
            indent = "        "
        kernel_row = f"({tap} // {dh})" if dh > 1 else tap
        lines.append(f"{indent}w_row = w_c + {kernel_row} * {kw} * C")
        lines += [f"{indent}acc{r} += xv{j} * tl.load(w_row + {j} * C, mask=c_ok, other=0.0).to(tl.float32)"
                  for j in range(kw)]  # the kernel laid out [KH * KW, C]
    return lines


def _stores(b: Builder, outputs: Sequence[Tensor], rows: int) -> list[str]:
    """Kernel lines from each row's accumulator to the epilogue's stores."""
    lines = ["if HAS_BIAS:",
             "    b_c = tl.load(bias + rc[None, :], mask=c_ok, other=0.0).to(tl.float32)",
             "else:",
             "    b_c = tl.full((1, BLOCK_C), 0.0, tl.float32)",
             "n64 = rc[None, :].to(tl.int64)"]
    for r in range(rows):
        lines += [f"oh = top + {r}",
                  f"acc = acc{r} + b_c",
                  "mask = in_w[:, None] & (oh < OH) & c_ok",
                  "m64 = (n * OH + oh) * OW + ow[:, None]",
                  *epilogue.tail(b, outputs)]
    return lines


class DepthwiseLauncher:
    """Runs a generated depthwise convolution on CUDA tensors (or CPU tensors under Triton's interpreter)."""

    def __init__(self, conv: L.ConvolutionLayer, layers: Sequence[L.Layer], inputs: Sequence[Tensor],
                 outputs: Sequence[Tensor], config: Config) -> None:
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        kernel = generate(conv, layers, inputs, outputs, config.rows)
        self.conv, self.config, self.window = conv, config, _Window.of(conv)
        self.epilogue = epilogue.Operands(kernel.inputs, kernel.weights, kernel.outputs, M_DIMS, N_DIM, True)
        self._fn = getattr(load_source(kernel.source), KERNEL_NAME)

    def __call__(self, x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor | None,
                 inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The epilogue's outputs for the convolution of `x` (read channels-last: converted where it is not) with
        `kernel` laid out [KH * KW, C] (`lay_out`) plus `bias`, and the epilogue's other `inputs`."""
        n, c, h, w = x.shape
        kh, kw = self.window.size
        if tuple(kernel.shape) != (kh * kw, c):
            raise EngineInputError(f"depthwise layer {self.conv.name!r}: input {list(x.shape)} does not fit a "
                                   f"kernel of {kernel.shape[-1]} channels and a {kh}x{kw} window")
        oh, ow = self.window.out_size(h, w)
        if oh < 1 or ow < 1:
            raise EngineInputError(f"depthwise layer {self.conv.name!r}: input {list(x.shape)} is smaller than "
                                   f"its window {[kh, kw]} (padding {list(self.window.padding)}, dilation "
                                   f"{list(self.window.dilation)})")
        if c * h * w >= 1 << 31:
            raise EngineInputError(f"depthwise layer {self.conv.name!r}: input {list(x.shape)} has 2**31 or more "
                                   f"values in one image, more than the generated kernel indexes")
        x = x.contiguous(memory_format=torch.channels_last)
        shape = (n, c, oh, ow)
        operands, outputs, strides = self.epilogue.bind(inputs, shape, x.device)
        if n * c * oh * ow == 0:
            return outputs
        cfg = self.config
        grid = (n * _cdiv(oh, cfg.rows) * _cdiv(ow, cfg.block_w), _cdiv(c, cfg.block_c))
        launch(self._fn, grid, x, kernel, kernel if bias is None else bias, *operands, *outputs, c, h, w, oh, ow,
               *x.stride(), *strides, HAS_BIAS=bias is not None, EVEN_C=c % cfg.block_c == 0, BLOCK_W=cfg.block_w,
               BLOCK_C=cfg.block_c, num_warps=cfg.warps, **chain_options())
        return outputs


def lay_out(kernel: torch.Tensor) -> torch.Tensor:
    """A depthwise kernel [C, 1, KH, KW] as the generated kernel reads it: [KH * KW, C], contiguous, in float32 (the
    value exactly; a half-precision weight would be converted at each of its loads: on sm_90 a 7x7 over four rows
    spent 224 conversions of weights an iteration against 224 multiply-adds)."""
    return kernel.reshape(kernel.shape[0], -1).t().float().contiguous()
