"""Creation and cast converters through the whole pipeline against eager: arange, full, zeros, ones
(and _like/new_ forms), eye, tensor, fill_, to, type_as, clone, detach, copy_, torchkiln's own ops."""
from typing import Optional

import pytest
import torch
from harness import check_fn

import torchkiln  # noqa: F401  (defines torch.ops.torchkiln.*)


def arange_end(x):
    return x + torch.arange(x.size(1)), torch.arange(5)


def arange_start_step(x):
    return x * torch.arange(1, 2 * x.size(1) + 1, 2), torch.arange(-1.5, 1.0, 0.25), torch.arange(3, -3, -2)


def arange_dtype(x):
    return (x + torch.arange(0, x.size(1), dtype=torch.float32), torch.arange(4, dtype=torch.int32) + 1,
            torch.arange(0.5, 3, dtype=torch.float64))


def full(x):
    return x + torch.full((2, x.size(1)), 1.5), torch.full((3,), 7), torch.full((2,), 2.5, dtype=torch.int64)


def zeros_ones(x):
    return torch.zeros(x.size(0), 3) + x.sum(), torch.ones(2, dtype=torch.int64) * 3, torch.zeros(()) + 1


def like(x):
    return (torch.zeros_like(x) + x, torch.ones_like(x, dtype=torch.int32), torch.full_like(x, -2),
            torch.full_like(x, 0.5, dtype=torch.float64))


def new(x):
    return x.new_zeros(2, 3) + x.sum(), x.new_ones([3]), x.new_full((2,), 4.0), x.new_ones(2, dtype=torch.bool)


def eye(x):
    """BAT's non-local block masks with `torch.eye(t, t, dtype=x.dtype)`."""
    return x * torch.eye(x.size(1), x.size(1), dtype=x.dtype), torch.eye(3, dtype=torch.int64), torch.eye(x.size(0), 5)


def tensor_from_lists(x):
    return (x + torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[1, 2], [3, 4]]), torch.tensor(2.5) * x,
            torch.tensor(3, dtype=torch.float32), torch.tensor([True, False]), torch.tensor(x.size(0)))


def tensor_overloads(x):
    return torch.tensor(float(x.size(0))) + x, torch.tensor(x.size(0) > 1), torch.tensor([x.size(0), 2])


def functional_fill(x):
    return torch.fill(x, 2.0) + x, torch.fill(x, x[0, 0])


def fill(x):
    y = x * 2
    z = y.fill_(3.0)  # lowering makes these functional: aten::full_like, aten::fill.Tensor
    w = (x + 1).fill_(x.sum())
    return z + 1, w


def fill_in_branch(x):
    # a branch known at build time: lowering keeps the in-place op, partitioning folds the branch
    y = x * 2
    if x.size(0) == 2:
        z = y.fill_(3.0)
    else:
        z = y
    w = x + 1
    if x.size(1) == 3:
        v = w.fill_(x[0, 0])
    else:
        v = w
    return z + 1, v


def to_dtype(x):
    return x.to(torch.float64), x.to(torch.int32), x.to(dtype=torch.float16), x.float(), x.half().float()


def to_other(x, y):
    return x.to(y), x.type_as(y), y.to(x)


def to_optional_dtype(x):
    d: Optional[torch.dtype] = None
    if x.size(0) == 2:  # folded at build time
        d = torch.float64
    return x.to(d), x.to(non_blocking=False, copy=True), x.to(dtype=torch.float64, copy=False)


def to_device(x):
    return x.to(x.device), x.to("cpu", torch.float64), x.to(x.device, copy=True)


def clone_detach(x):
    return (x.clone() + 1, x.detach() * 2, x.clone(memory_format=torch.contiguous_format) - 1,
            x.to(torch.float64, memory_format=torch.channels_last) * 2)


def copy(x, y):
    z = torch.zeros(2, 3)
    w = z.copy_(y)  # lowering makes these functional: aten::copy
    v = (x * 2).copy_(y[0])
    return w + x, v


def copy_in_branch(x, y):
    z = x * 2
    if x.size(0) == 2:
        w = z.copy_(y[0])
    else:
        w = z
    return w + 1


def const(x):
    return torch.ops.torchkiln.const(x) + torch.ops.torchkiln.const(torch.ones(3))


R = torch.randn
CASES = [
    (arange_end, [R(2, 4)]),
    (arange_start_step, [R(2, 3)]),
    (arange_dtype, [R(2, 3)]),
    (full, [R(2, 3)]),
    (zeros_ones, [R(2, 3)]),
    (like, [R(2, 3)]),
    (new, [R(2, 3)]),
    (eye, [R(3, 3)]),
    (tensor_from_lists, [R(3)]),
    (fill, [R(2, 3)]),
    (to_dtype, [R(2, 3) * 10]),
    (to_other, [R(2, 3), torch.randint(0, 5, (2, 3))]),
    (to_device, [R(2, 3)]),
    (to_optional_dtype, [R(2, 3)]),
    (tensor_overloads, [R(2, 3)]),
    (functional_fill, [R(2, 3)]),
    (clone_detach, [R(2, 3, 4, 5)]),
    (copy, [R(2, 3), torch.randint(0, 5, (2, 3))]),
    (copy_in_branch, [R(2, 3), torch.randint(0, 5, (2, 3))]),
    (fill_in_branch, [R(2, 3)]),
    (const, [R(3)]),
]


@pytest.mark.parametrize("fn, example", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_creation_op(fn, example):
    check_fn(fn, *example)


def test_attn_bias_from_attn_mask():
    x = R(2, 3)
    ref = torch.where(x > 0, 0.0, float("-inf"))
    assert torch.equal(torch.ops.torchkiln.attn_bias_from_attn_mask(x > 0), ref)
    check_fn(attn_bias, x > 0, R(2, 3))


def attn_bias(mask, bias):
    return torch.ops.torchkiln.attn_bias_from_attn_mask(mask) + 1, torch.ops.torchkiln.attn_bias_from_attn_mask(bias)


def int_creation(x):
    return x + torch.arange(x.size(1)), torch.zeros_like(x) + 2, x.new_full((2,), 3), x.to(torch.float32)


@pytest.mark.parametrize("truncate", [False, True])
def test_int64(truncate):
    check_fn(int_creation, torch.randint(-5, 5, (2, 3)), truncate_long_and_double=truncate)


def to_other_device(x):
    return x.to("meta").shape[0] + x


def test_to_another_device_stays_in_pytorch():
    _, report = check_fn(to_other_device, R(2, 3), engines=None, torch_blocks=None)
    fallback = {f.op: f.detail for b in report.blocks for f in b.fallback}
    assert "moves the tensor" in fallback["aten::to.prim_Device"], fallback


@pytest.mark.parametrize("fn, example, op", [
    (fill_in_branch, [R(2, 3)], "aten::fill_.Scalar"),
    (fill_in_branch, [R(2, 3)], "aten::fill_.Tensor"),
    (copy_in_branch, [R(2, 3), torch.randint(0, 5, (2, 3))], "aten::copy_"),
    (copy, [R(2, 3), torch.randint(0, 5, (2, 3))], "aten::copy"),
    (fill, [R(2, 3)], "aten::fill.Tensor"),
])
def test_inplace_forms_convert(fn, example, op):
    _, report = check_fn(fn, *example)
    assert op in report.blocks[0].ops, report
