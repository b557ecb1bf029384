"""A compiled module whose forward is one engine call runs the engine straight from Python: the same results and
errors as the interpreter's path, which every other module (and call) keeps."""
import pytest
import torch
from torch import nn

import torchkiln
from torchkiln.examples import MLP
from torchkiln.stitching.module import one_engine_call
from test_end_to_end import WithUnsupportedOp


class TwoHeads(nn.Module):
    """Two outputs, returned in the other order than computed, and an argument the engine does not read."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 4)

    def forward(self, x, unused, y):
        return torch.relu(self.b(y)), torch.tanh(self.a(x))


def test_a_whole_model_engine_is_one_call_and_matches_the_interpreter():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((2, 64))])
    call = one_engine_call(compiled.graph)
    assert call is not None and call.num_args == 1 and call.args == (0,) and call.result == 0
    x = torch.randn(2, 64)
    ref = model(x)
    out, interpreted = compiled(x), compiled.forward(x)  # forward: TorchScript's interpreter and the dispatcher
    assert torch.equal(out, interpreted) and (out - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_arguments_and_outputs_are_mapped_by_position():
    torch.manual_seed(0)
    model = TwoHeads().eval()
    x, unused, y = torch.randn(3, 16), torch.randn(1), torch.randn(3, 16)
    compiled = torchkiln.compile(model, [x, unused, y], min_block_size=1)
    call = one_engine_call(compiled.graph)
    assert call is not None and call.num_args == 3 and sorted(call.args) == [0, 2] and isinstance(call.result, tuple)
    out = compiled(x, unused, y)
    for got, interpreted, ref in zip(out, compiled.forward(x, unused, y), model(x, unused, y)):
        assert torch.equal(got, interpreted) and (got - ref).abs().max() <= 1e-4 * ref.abs().max()
    with pytest.raises(torchkiln.EngineInputError, match=r"expected shape \(3, 16\), got \(5, 16\)"):
        compiled(torch.randn(5, 16), unused, y)


def test_a_module_with_pytorch_ops_left_is_not_one_call():
    model = WithUnsupportedOp().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((2, 3, 8, 8))])
    assert one_engine_call(compiled.graph) is None


def test_keyword_arguments_take_the_interpreters_path():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((2, 64))])
    x = torch.randn(2, 64)
    assert torch.equal(compiled(x=x), compiled(x))
