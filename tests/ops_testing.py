"""Helper of the elementwise and activation op tests (test_ops_elementwise_*.py, test_ops_activation.py)."""
import torch
from harness import check_fn


def check(fn, *example, **kwargs):
    """check_fn, after making sure `fn` scripts: a function that only traces would test another graph."""
    torch.jit.script(fn)
    return check_fn(fn, *example, **kwargs)
