"""functionalize_view_writes: in-place ops into slices of a fresh tensor convert (as scatters of the functional
op) where alias analysis shows nothing else sees the memory; everything else stays in PyTorch, never wrong."""
import copy
from typing import List

import pytest
import torch
import torch.nn.functional as F
from harness import (assert_converted, assert_falls_back, assert_matches_eager, check_compiled, check_fn, check_traced,
                     wrap)

from torchkiln.compiler import compile_with_report


def shifted_window_update(x):
    """Swin- and cache-style writes into slices: +=, *= on a row, an assignment of a broadcast column."""
    y = x * 2
    y[:, 1:3] += 1.0
    y[0] *= 3.0
    y[:, :1] = x[:, 4:5]
    return y


def integer_write_keeps_its_dtype(x):
    y = x * 10
    y[1:3] += x[0:2].double()  # in place into a float32 tensor: the float64 sum is cast back
    return y


def read_before_and_after(x):
    y = x + 1
    total = y.sum()
    y[:, -2:] *= -1.0
    return y.relu(), total


def overlapping_view_read_after(x):
    y = x * 2
    s = y[0:2]
    s.add_(1.0)
    t = y[1:3]
    t.mul_(2.0)
    return s + 1, y


def transposed_view_made_before(x):
    y = x * 2
    v = y.t()
    y[0] += 1.0
    return v * 1.0


def write_into_the_input(x):
    x[:, 0] += 1.0
    return x * 2


def shape_change_in_place(x):
    y = x * 2
    v = y[1:3]
    v.unsqueeze_(0)  # changes the view's shape, not the memory: no scatter
    return y + 1.0, v


def test_writes_into_slices_of_a_fresh_tensor_convert():
    _, report = check_fn(shifted_window_update, torch.randn(4, 5))
    assert "aten::slice_scatter" in report.blocks[0].ops and "aten::select_scatter" in report.blocks[0].ops


def test_an_in_place_write_keeps_the_views_dtype():
    check_fn(integer_write_keeps_its_dtype, torch.randn(4, 5))


def test_reads_before_the_write_see_the_old_values():
    check_fn(read_before_and_after, torch.randn(4, 5))


def test_a_written_view_read_after_another_overlapping_write_stays_in_pytorch():
    _, report = check_fn(overlapping_view_read_after, torch.randn(4, 5), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::add_.Scalar", "a view made by aten::slice")


def test_an_older_view_of_the_base_keeps_the_write_in_pytorch():
    _, report = check_fn(transposed_view_made_before, torch.randn(4, 5), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::add_.Scalar", "a view made by aten::select")


def test_a_write_into_the_callers_tensor_stays_in_pytorch():
    x = torch.randn(4, 5)
    model = torch.jit.script(wrap(write_into_the_input, 1))
    compiled, report = compile_with_report(model, [x], min_block_size=1)
    assert "aten::slice_scatter" not in str(report)
    eager_x, compiled_x = x.clone(), x.clone()
    assert_matches_eager(compiled(compiled_x), model(eager_x))
    assert_matches_eager(compiled_x, eager_x)  # the caller's tensor is written as eager writes it


def shifted_window_mask(x: torch.Tensor, window_size: List[int], shift_size: List[int]) -> torch.Tensor:
    """torchvision's shifted_window_attention, cut to its static shift logic and its mask-building loop: pad to
    whole windows, drop the shift where one window covers the map, roll, and add a mask built by slice writes
    into a fresh tensor to each window's (token x token) scores."""
    B, H, W, C = x.shape
    pad_r = (window_size[1] - W % window_size[1]) % window_size[1]
    pad_b = (window_size[0] - H % window_size[0]) % window_size[0]
    x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    _, pad_H, pad_W, _ = x.shape
    shift_size = shift_size.copy()
    if window_size[0] >= pad_H:
        shift_size[0] = 0
    if window_size[1] >= pad_W:
        shift_size[1] = 0
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))
    num_windows = (pad_H // window_size[0]) * (pad_W // window_size[1])
    x = x.view(B, pad_H // window_size[0], window_size[0], pad_W // window_size[1], window_size[1], C)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(B * num_windows, window_size[0] * window_size[1], C)
    attn = x.matmul(x.transpose(-2, -1))
    if sum(shift_size) > 0:
        attn_mask = x.new_zeros((pad_H, pad_W))
        h_slices = ((0, -window_size[0]), (-window_size[0], -shift_size[0]), (-shift_size[0], None))
        w_slices = ((0, -window_size[1]), (-window_size[1], -shift_size[1]), (-shift_size[1], None))
        count = 0
        for h in h_slices:
            for w in w_slices:
                attn_mask[h[0]:h[1], w[0]:w[1]] = count
                count += 1
        attn_mask = attn_mask.view(pad_H // window_size[0], window_size[0], pad_W // window_size[1], window_size[1])
        attn_mask = attn_mask.permute(0, 2, 1, 3).reshape(num_windows, window_size[0] * window_size[1])
        attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
        attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        attn = attn.view(x.size(0) // num_windows, num_windows, x.size(1), x.size(1))
        attn = attn + attn_mask.unsqueeze(0)
        attn = attn.view(-1, x.size(1), x.size(1))
    return attn.softmax(-1)


class ShiftedWindowMask(torch.nn.Module):
    def __init__(self, window: int, shift: int) -> None:
        super().__init__()
        self.window_size = [window, window]
        self.shift_size = [shift, shift]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted_window_mask(x, self.window_size, self.shift_size)


class GhostModule(torch.nn.Module):
    """timm's GhostModule: a convolution, a cheap depthwise one on its result, both concatenated and sliced."""

    def __init__(self, in_chs: int, out_chs: int) -> None:
        super().__init__()
        self.out_chs = out_chs
        init_chs = (out_chs + 1) // 2
        self.primary_conv = torch.nn.Sequential(torch.nn.Conv2d(in_chs, init_chs, 1), torch.nn.ReLU())
        self.cheap_operation = torch.nn.Conv2d(init_chs, init_chs, 3, padding=1, groups=init_chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary_conv(x)
        x2 = self.cheap_operation(x1)
        out = torch.cat([x1, x2], dim=1)
        return out[:, :self.out_chs, :, :]


class GhostBottleneck(torch.nn.Module):
    """timm's GhostBottleneck: `x += self.shortcut(shortcut)` in place into the slice a GhostModule returns."""

    def __init__(self, in_chs: int, out_chs: int) -> None:
        super().__init__()
        self.ghost1 = GhostModule(in_chs, 8)
        self.ghost2 = GhostModule(8, out_chs)
        self.shortcut = torch.nn.Sequential() if in_chs == out_chs else torch.nn.Conv2d(in_chs, out_chs, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.ghost1(x)
        x = self.ghost2(x)
        x += self.shortcut(shortcut)
        return x


def written_view_then_base_written_again(x):
    """The view written in place is read after a later write into its base (through a newer view), which it
    must see: not provable by the rewrite, so it stays in PyTorch."""
    out = torch.cat([x, x * 2], dim=1)
    y = out[:, :3]
    y += 1.0
    z = out[:, 1:2]
    z.mul_(0.0)
    return y * 1.0


class BufferWrite(torch.nn.Module):
    """A write into a slice of a buffer: the module's state changes on every call, so it stays in PyTorch."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        view = self.state[:, :3]
        view += 1.0
        return x + self.state


@pytest.mark.parametrize("size,window,shift", [(8, 4, 2), (6, 4, 2), (3, 4, 2), (8, 4, 0)])
def test_swin_shifted_window_mask_is_one_engine(size, window, shift):
    """The shift list's copy and item sets evaluate at build time; the mask's slice writes become scatters."""
    _, report = check_compiled(torch.jit.script(ShiftedWindowMask(window, shift)), [torch.randn(2, size, size, 3)],
                               min_block_size=1)
    if shift and size > window:
        assert_converted(report, "aten::slice_scatter")


@pytest.mark.parametrize("in_chs,out_chs", [(5, 5), (4, 5)])
def test_ghostnet_in_place_add_into_a_slice_of_a_fresh_tensor_is_one_engine(in_chs, out_chs):
    """`x += shortcut` into a slice of a fresh cat whose base nothing reads again becomes `x = x + shortcut`."""
    _, report = check_compiled(torch.jit.script(GhostBottleneck(in_chs, out_chs)), [torch.randn(1, in_chs, 6, 6)],
                               min_block_size=1)
    assert_converted(report, "aten::add.Tensor")


def test_an_in_place_shape_change_of_a_view_is_no_write():
    check_fn(shape_change_in_place, torch.randn(4, 5), engines=None, torch_blocks=None)


def test_a_written_view_that_must_see_a_later_write_stays_in_pytorch():
    _, report = check_fn(written_view_then_base_written_again, torch.randn(4, 2), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::add_.Scalar", "a view made by aten::slice")


def test_a_write_into_a_slice_of_a_buffer_stays_in_pytorch():
    model, x = torch.jit.script(BufferWrite()), torch.randn(4, 5)
    eager = copy.deepcopy(model)
    compiled, report = compile_with_report(model, [x], min_block_size=1)
    assert "aten::slice_scatter" not in str(report)
    for _ in range(3):  # the state grows with every call, in both, from the same start: compiling runs the
        assert_matches_eager(compiled(x), eager(x))  # method for shape analysis on a copy of the module


def funnel_relative_shift_then_mask(q, r, cls_mask):
    """transformers' FunnelRelMultiheadAttention.relative_positional_attention: the einsum's scores shifted by two
    reshapes and slices (`_relative_shift_gather`), then `positional_attn *= cls_mask` in place into that view of
    memory nothing else reads again."""
    positional_attn = torch.einsum("binh,tnh->bnit", q, r)
    batch, heads, seq, max_rel = positional_attn.shape
    positional_attn = torch.reshape(positional_attn, [batch, heads, max_rel, seq])[:, :, 1:, :]
    positional_attn = torch.reshape(positional_attn, [batch, heads, seq, max_rel - 1])[..., :seq]
    positional_attn *= cls_mask
    return positional_attn.softmax(-1)


def dead_view_write_but_base_read_after(x):
    """The same write, but the base is read afterwards and a reshape is no slice: it stays in PyTorch."""
    y = x * 2
    v = y.reshape(5, 4)[:, :2]
    v.mul_(3.0)
    return v + 1.0, y


def beit_relative_position_index(x, table):
    """transformers' BeitRelativePositionBias: a permuted, contiguous coordinate difference written in place
    through selections (`relative_coords[:, :, 0] += window_size[0] - 1`), summed into a table's index."""
    wh, ww = x.shape[-2], x.shape[-1]
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij"))
    coords_flatten = torch.flatten(coords, 1)
    relative_coords = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
    relative_coords[:, :, 0] += wh - 1
    relative_coords[:, :, 1] += ww - 1
    relative_coords[:, :, 0] *= 2 * ww - 1
    index = relative_coords.sum(-1)
    bias = table[index.view(-1)].view(wh * ww, wh * ww, -1).permute(2, 0, 1)
    return x.flatten(-2).unsqueeze(-1) + bias


def contiguous_of_memory_read_after(x):
    """`contiguous` of an already contiguous tensor is the tensor itself, so the write shows through `y` too:
    not a copy, so it stays in PyTorch."""
    y = x * 2
    c = y.contiguous()
    c[0] += 1.0
    return c * 1.0, y


def test_a_write_into_a_reshaped_view_of_memory_read_nowhere_else_converts():
    _, report = check_traced(funnel_relative_shift_then_mask, torch.randn(2, 6, 4, 8), torch.randn(13, 4, 8),
                             torch.randn(6, 6))
    assert_converted(report, "aten::mul.Tensor")


def test_a_write_into_a_reshaped_view_of_memory_read_afterwards_stays_in_pytorch():
    _, report = check_fn(dead_view_write_but_base_read_after, torch.randn(4, 5), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::mul_.Scalar", "a view made by aten::slice")


def test_a_write_into_a_contiguous_copy_of_a_permuted_fresh_tensor_converts():
    _, report = check_traced(beit_relative_position_index, torch.randn(2, 3, 4, 5), torch.randn(63, 3))
    assert_converted(report, "aten::select_scatter")


def test_a_write_into_contiguous_of_memory_read_afterwards_stays_in_pytorch():
    _, report = check_fn(contiguous_of_memory_read_after, torch.randn(4, 5), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::add_.Scalar", "a view made by aten::select")


def dead_view_write_base_returned(x):
    y = x * 2
    v = y.reshape(5, 4)[:, :2]
    v.mul_(3.0)
    return y


def test_a_write_into_a_reshaped_view_of_the_returned_tensor_stays_in_pytorch():
    _, report = check_fn(dead_view_write_base_returned, torch.randn(4, 5), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::mul_.Scalar", "a view made by aten::slice")


def split_after_an_in_place_activation(x):
    """DLA's Res2Net block: relu_ of new memory, then a split whose pieces share a list with other tensors."""
    out = F.relu(x * 2.0, inplace=True)
    parts = torch.split(out, 2, 1)
    pieces: List[torch.Tensor] = []
    sp = parts[0]
    for i in range(2):
        sp = F.relu(sp * 3.0 + parts[i], inplace=True)
        pieces.append(sp)
    pieces.append(parts[-1])
    return torch.cat(pieces, 1)


def statement_write_then_views(x):
    y = x - 0.5
    y.relu_()
    a, b = y.split(3, 1)
    return torch.cat([b, a * 2.0], 1)


def view_made_before_a_write_into_its_base(x):
    y = x - 0.5
    v = y[:, :3]
    y.relu_()
    return v + 1.0, y


def test_a_write_into_new_memory_before_its_views_are_made_converts():
    """The write into the fresh tensor comes before every view of it: it becomes the functional op (whether its
    result or the tensor itself is read after it), and the split and its readers convert."""
    for fn in (split_after_an_in_place_activation, statement_write_then_views):
        _, report = check_fn(fn, torch.randn(2, 6, 5))
        assert_converted(report, "aten::split.Tensor")


def test_a_view_made_before_a_write_into_its_base_stays_in_pytorch():
    _, report = check_fn(view_made_before_a_write_into_its_base, torch.randn(2, 6, 5), engines=None,
                         torch_blocks=None)
    assert_falls_back(report, "aten::relu_", "has an alias made by aten::slice that would see the change")
