"""The pointwise epilogue of a generated product kernel (a GEMM, a depthwise convolution): the pointwise layers
after the product, computed on the product's tile before it is stored.

The product's output is addressed as a 2-D [M, N] tile: N one dim of the output (a linear layer's last dim, a
convolution's channels) and M the flat index over the others, in order (`m_dims`). Its value enters the epilogue
rounded to the product's dtype (as the library kernel's output tensor is); the layers are the pointwise generator's
(`pointwise.emit_layers`), so an op computes the same expression as in a pointwise kernel; the epilogue's other
operands (a residual, a per-channel vector, a single value) are read through 2-D strides over the same M and N
(`strides_2d`), laid out as the product's output where no such strides exist.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen.pointwise import TL, Builder, emit_layers, pointer_load, stored


def build(made: Tensor, layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
          approximate_division: bool = False) -> Builder:
    """The epilogue computing `outputs` from the product's output `made` (the accumulator `acc` of the kernel)
    through the pointwise `layers`; `inputs` are its other inputs. Without layers, the product is the output.
    `approximate_division`: as `Builder`'s."""
    if any(tuple(t.shape) != tuple(made.shape) for t in outputs):
        raise NetworkError(f"epilogue outputs {[list(t.shape) for t in outputs]} are not all of the product's "
                           f"shape {list(made.shape)}")
    b = Builder(made.rank, approximate_division)
    b.values[id(made)] = b.emit(f"acc.to({TL[made.dtype]}).to(tl.float32)", torch.float32)  # the product's rounding
    for i, t in enumerate(inputs):
        if t.rank > made.rank:
            raise NetworkError(f"epilogue input {t.name!r} of rank {t.rank} does not broadcast to rank {made.rank}")
        b.values[id(t)] = b.operand(f"in{i}", t)
    if layers:
        emit_layers(b, layers, outputs, [made, *inputs])
    elif [id(t) for t in outputs] != [id(made)]:
        raise NetworkError(f"a product without epilogue layers returns its product only, not "
                           f"{[t.name for t in outputs]}")
    return b


def pointer_params(b: Builder, outputs: Sequence[Tensor]) -> list[str]:
    """The kernel parameters the epilogue reads and writes through: operands, then outputs."""
    return [*b.operands, *(f"out{k}" for k in range(len(outputs)))]


def stride_params(b: Builder, outputs: Sequence[Tensor]) -> list[str]:
    """The 2-D strides of every operand and output, as kernel parameters."""
    return [f"{p}_{d}" for p in pointer_params(b, outputs) for d in ("m", "n")]


def tail(b: Builder, outputs: Sequence[Tensor], described: Sequence[str] = (), corner: str = "") -> list[str]:
    """Kernel lines from the accumulator `acc`, the int64 tile indices `m64` [BLOCK, 1] and `n64` [1, BLOCK] and
    the tile's `mask` to the stores. The operands and outputs named in `described` are tensor descriptors over their
    [M, N] view (`described_params`): read and written as the tile at `corner` (its first row and column), which
    the descriptor clips to the view."""
    lines = [f"o_{p} = m64 * {p}_m + n64 * {p}_n" for p in pointer_params(b, outputs) if p not in described]
    lines += [_described_load(line, described, corner) for line in b.lines]
    for k, t in enumerate(outputs):
        value = stored(b.values[id(t)], t.dtype)
        lines.append(f"out{k}.store([{corner}], {value})" if f"out{k}" in described else
                     f"tl.store(out{k} + o_out{k}, {value}, mask=mask)")
    return lines


def _described_load(line: str, described: Sequence[str], corner: str) -> str:
    for name in described:
        line = line.replace(pointer_load(name), f"{name}.load([{corner}])")
    return line


def described_params(b: Builder, made: Tensor, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[str]:
    """The operands and outputs a kernel may bind as tensor descriptors: outputs, and inputs it loads of the
    product's shape (not broadcast), of a type the copy engine moves (not bool)."""
    names = [f"in{i}" for i, t in enumerate(inputs) if tuple(t.shape) == tuple(made.shape)
             and t.dtype != torch.bool and any(pointer_load(f"in{i}") in line for line in b.lines)]
    return names + [f"out{k}" for k, t in enumerate(outputs) if t.dtype != torch.bool]


def strides_2d(x: torch.Tensor, shape: Sequence[int], m_dims: Sequence[int], n_dim: int) -> tuple[int, int] | None:
    """(stride of m, stride of n) such that element (m, n) of `x` broadcast to `shape` is at m * sm + n * sn, m the
    flat index over `m_dims` (in order) and n the index along `n_dim`; None where no such pair exists."""
    e = x.expand(*shape)
    sn = e.stride(n_dim) if shape[n_dim] != 1 else 0
    sm, span = 0, None
    for d in reversed(m_dims):
        if shape[d] == 1:
            continue
        if span is None:
            sm = e.stride(d)
        elif e.stride(d) != span:
            return None
        span = e.stride(d) * shape[d]
    return sm, sn


class Operands:
    """What a launcher binds to an epilogue: its inputs and weights with their 2-D strides, and new outputs."""

    def __init__(self, inputs: Sequence[Tensor], weights: Sequence[torch.Tensor], outputs: Sequence[Tensor],
                 m_dims: Sequence[int], n_dim: int, channels_last: bool) -> None:
        self.inputs, self.weights, self.outputs = tuple(inputs), tuple(weights), tuple(outputs)
        self.m_dims, self.n_dim, self.channels_last = tuple(m_dims), n_dim, channels_last
        self._placed: dict[torch.device, list[torch.Tensor]] = {}

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        """`x` in the product's memory format (channels-last for a convolution)."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x.contiguous()

    def bind(self, inputs: Sequence[torch.Tensor], shape: Sequence[int], device: torch.device
             ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
        """(operands, new outputs, every operand's and output's 2-D strides in `stride_params` order)."""
        if len(inputs) != len(self.inputs):
            raise EngineInputError(f"the epilogue takes {len(self.inputs)} inputs, got {len(inputs)}")
        placed = self._placed.get(device)
        if placed is None:
            placed = self._placed[device] = [w.to(device) for w in self.weights]
        operands, strides = [], []
        for t in (*inputs, *placed):
            found = strides_2d(t, shape, self.m_dims, self.n_dim)
            if found is None:
                t = self.layout(t.expand(*shape))
                found = strides_2d(t, shape, self.m_dims, self.n_dim)
            operands.append(t)
            strides += found
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        outputs = [torch.empty(tuple(shape), dtype=t.dtype, device=device, memory_format=fmt) for t in self.outputs]
        for o in outputs:
            strides += strides_2d(o, shape, self.m_dims, self.n_dim)
        return operands, outputs, strides
