"""functionalize_view_writes: in-place ops into slices of a fresh tensor convert (as scatters of the functional
op) where alias analysis shows nothing else sees the memory; everything else stays in PyTorch, never wrong."""
import torch
from harness import assert_falls_back, assert_matches_eager, check_fn, wrap

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
