"""A compiled module's outputs never share memory with its constants (stitching/fresh_outputs.py): writing into
one leaves the next call's outputs as they were, and outputs alias one another, and the inputs, as eager's do."""
import io

import pytest
import torch
from harness import assert_matches_eager

import torchkiln


class ConstantOutputs(torch.nn.Module):
    """Outputs that lowering freezes into constants: a buffer, views and containers of it, values computed from
    weights alone; besides one an engine computes and the input itself."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(4))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        w = self.lin.weight.sum(0) * 3
        return (self.lin(x).relu() * 2, self.table, [self.table], w, w.view(2, 2), self.table.view(2, 2),
                {"bias": self.lin.bias * 1}, self.table[1:], x)


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value
    return [t for v in items for t in _leaves(v)]


def _sharing(tensors):
    """For each tensor, the positions of those that share its memory."""
    ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    return [[j for j, q in enumerate(ptrs) if q == p] for p in ptrs]


@pytest.mark.filterwarnings("ignore:.*compiled with 0 engines")
@pytest.mark.parametrize("min_block_size", [1, 3])  # an engine for the linear, or none
@pytest.mark.parametrize("saved", [False, True])
def test_writing_into_an_output_leaves_the_next_calls_alone(min_block_size, saved):
    torch.manual_seed(0)
    model = ConstantOutputs().eval()
    x = torch.randn(2, 4)
    compiled = torchkiln.compile(model, [x], min_block_size=min_block_size)
    if saved:
        buffer = io.BytesIO()
        torch.jit.save(compiled, buffer)
        buffer.seek(0)
        compiled = torch.jit.load(buffer)
    with torch.no_grad():
        ref = model(x)
    first = compiled(x)
    assert_matches_eager(first, ref)
    assert _sharing(_leaves(first)) == _sharing(_leaves(ref))  # a buffer and its views still share, as in eager
    assert _leaves(first)[-1] is x
    for out in _leaves(first)[:-1]:
        out.add_(1000)
    assert_matches_eager(compiled(x), ref)
