"""Helpers of the elementwise and activation op tests (test_ops_elementwise_*.py, test_ops_activation.py)."""
import torch
from harness import check_fn


def check(fn, *example, **kwargs):
    """check_fn, after making sure `fn` scripts: a function that only traces would test another graph."""
    torch.jit.script(fn)
    return check_fn(fn, *example, **kwargs)


def through_if(op):
    """fn(x) = op(x * 2) inside an `if` on x's rank. The `if` is folded only at partitioning, after
    lowering's RemoveTensorMutation ran, so an in-place `op` reaches its in-place converter."""
    def fn(x):
        y = x * 2
        if x.dim() == 2:
            z = op(y)
        else:
            z = y
        return z
    return fn


def through_if2(op):
    """through_if for an op of two tensors: fn(x, other) = op(x * 2, other)."""
    def fn(x, other):
        y = x * 2
        if x.dim() == 2:
            z = op(y, other)
        else:
            z = y
        return z
    return fn


def inplace_in_engine(fn, op, *example, **kwargs):
    """check `fn` and that the in-place overload `op` itself was converted in the engine block."""
    _, report = check(fn, *example, **kwargs)
    (block,) = report.blocks
    assert op in block.ops, f"{op} not converted as such: {block.ops}"
