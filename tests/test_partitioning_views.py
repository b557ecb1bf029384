"""In-place writes into views: the base, its views and the writers never split across an engine boundary.

An engine returns fresh tensors, so a view made inside one is a copy: a write into it that stays in PyTorch
would change the copy and leave the base (and eager's answer) behind. Each case runs twice, so a build-time
constant that a write changed would show on the second call.
"""
import pytest
import torch
from harness import assert_matches_eager, check_fn, check_traced, wrap

import torchkiln

from torchkiln.partitioning.support import Fallback


def slice_write(x):
    y = (x * 2).relu().exp()
    z = torch.zeros(4, 4)
    z[1:, 1:] = y[1:, 1:]
    return (y * 3 + 1).sin() + z


def slice_write_read_back(x):
    y = (x * 2).relu().exp()
    z = torch.zeros(4, 4)
    w = z[1:, 1:]
    w.copy_(y[1:, 1:])
    return (y * 3 + 1).sin() + z, w


def slice_write_read_back_after_another_write(x):
    y = (x * 2).relu().exp()
    z = torch.zeros(4, 4)
    w = z[1:, 1:]
    w.copy_(y[1:, 1:])
    z[1] = y[0]  # w must see this row too
    return (y * 3 + 1).sin() + z, w


def select_write(x):
    y = (x * 2).relu().exp()
    z = torch.zeros(4, 4)
    z[0] = y[1]
    return (y * 3 + 1).sin() + z


def chain_of_views_write(x):
    y = (x * 2).relu().exp()
    z = torch.zeros(4, 4)
    w = z.view(2, 8).transpose(0, 1)[1:3]  # a view of a view of a view
    w.mul_(0.0)
    w.add_(y.reshape(8, 2)[2:4])
    return (y * 3 + 1).sin() + z * 2


def narrow_fill(x):
    y = (x * 2).relu().exp()
    z = torch.ones(4, 4) * 2
    z.narrow(1, 1, 2).fill_(0.5)
    z.unsqueeze(0)[0, 3].zero_()
    return (y * 3 + 1).sin() + z


def index_put_write(x):
    y = (x * 2).relu().exp()
    z = torch.zeros(4, 4)
    z[:, 2].masked_fill_(y[:, 2] > 1.5, 7.0)
    z[1:3].index_put_([torch.tensor([0, 1])], y[0:2], accumulate=True)
    return (y * 3 + 1).sin() + z


def written_method_input(x):
    y = (x * 2).relu()
    x[1:, :2] = y[:3, 2:]
    return (y + 1).exp() + x.sin()


def relative_position_table(x):
    """How relative-position index tables are built (Swin, T5-style biases)."""
    coords = torch.arange(4)
    table = torch.zeros(4, 4, dtype=torch.long)
    table[:, :] = coords.unsqueeze(1) - coords.unsqueeze(0) + 3
    table[0, 0] = 0
    bias = (x * 2 + 1).flatten()[table.flatten() + 5].reshape(4, 4)
    return bias.sin() * x.exp()


CASES = [slice_write, select_write, chain_of_views_write, narrow_fill, index_put_write, relative_position_table]


def _check_twice(compiled, fn, x):
    for _ in range(2):
        xs = x.clone(), x.clone()
        assert_matches_eager(compiled(xs[0]), fn(xs[1]))
        assert_matches_eager(xs[0], xs[1], path="input after the call")


@pytest.mark.parametrize("check", [check_fn, check_traced], ids=["scripted", "traced"])
@pytest.mark.parametrize("min_block_size", [1, 3])
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_write_into_view(fn, min_block_size, check):
    x = torch.randn(4, 4)
    compiled, _ = check(fn, x, engines=None, torch_blocks=None, min_block_size=min_block_size)
    _check_twice(compiled, fn, torch.randn(4, 4))


def test_write_into_method_input_view():
    """The caller's tensor changes as in eager (check_fn would run eager on the example first, changing it)."""
    module = torch.jit.script(wrap(written_method_input, 1))
    compiled = torchkiln.compile(module, [torchkiln.Input((4, 4))], min_block_size=1)
    _check_twice(compiled, written_method_input, torch.randn(4, 4))


def test_a_slice_write_no_one_reads_back_converts():
    """z[1:, 1:] = ... with nothing reading the slice afterwards: a slice_scatter (functionalize_view_writes)."""
    _, report = check_fn(slice_write, torch.randn(4, 4))
    assert "aten::slice_scatter" in report.blocks[0].ops


def test_a_written_slice_read_back_converts():
    """Nothing writes into z after the copy_: the slice read back reads the value copied in, z the scatter."""
    _, report = check_fn(slice_write_read_back, torch.randn(4, 4))
    assert "aten::slice_scatter" in report.blocks[0].ops


def test_view_and_writer_stay_together_in_pytorch():
    """The safe minimum where the written slice is read back after another write into its base: the base z, its
    views and the copy_s all run in PyTorch; the rest in engines."""
    _, report = check_fn(slice_write_read_back_after_another_write, torch.randn(4, 4), engines=None,
                         torch_blocks=None)
    left = {(f.op, f.reason) for b in report.blocks for f in b.fallback}
    assert left == {("aten::zeros", Fallback.WRITTEN_VIEW), ("aten::slice.Tensor", Fallback.WRITTEN_VIEW),
                    ("aten::select.int", Fallback.WRITTEN_VIEW), ("aten::copy_", Fallback.CAPABILITY)}
    engine_ops = [op for b in report.blocks if b.target == "engine" for op in b.ops]
    assert {"aten::exp", "aten::sin", "aten::add.Tensor"} <= set(engine_ops)


def test_a_write_with_no_view_still_converts():
    """A fresh tensor written in place, with no view of it anywhere, still runs in one engine."""
    def fill_fresh(x):
        z = x * 2
        z.add_(1.0)
        return z.relu()

    check_fn(fill_fresh, torch.randn(4, 4), engines=1, torch_blocks=0)
