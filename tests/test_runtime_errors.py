"""Wrong inputs at run time get an error naming the input and what was expected."""
import pytest
import torch

import torchkiln
from torchkiln.examples import MLP
from torchkiln.runtime.execute_op import engine_from_blob


@pytest.fixture(scope="module")
def compiled():
    return torchkiln.compile(MLP().eval(), [torchkiln.Input((2, 64))])


def test_wrong_shape(compiled):
    with pytest.raises(RuntimeError, match=r"EngineInputError: engine input 0 \('x'\): expected shape \(2, 64\), got \(3, 64\)"):
        compiled(torch.randn(3, 64))


def test_wrong_rank(compiled):
    with pytest.raises(RuntimeError, match=r"expected shape \(2, 64\), got \(2, 64, 1\)"):
        compiled(torch.randn(2, 64, 1))


def test_wrong_dtype(compiled):
    with pytest.raises(RuntimeError, match=r"engine input 0 \('x'\): expected dtype torch.float32, got torch.float64"):
        compiled(torch.randn(2, 64, dtype=torch.float64))


def test_wrong_device(compiled):
    with pytest.raises(RuntimeError, match=r"engine input 0 \('x'\): expected a tensor on cpu, got one on meta"):
        compiled(torch.empty(2, 64, device="meta"))


def test_wrong_number_of_inputs_to_module(compiled):
    with pytest.raises(RuntimeError, match=r"forward\(\) expected at most 2 argument\(s\) but received 3"):
        compiled(torch.randn(2, 64), torch.randn(2, 64))


def test_wrong_number_of_inputs_to_engine(compiled):
    engine = engine_from_blob(compiled._torchkiln_engine_0)
    with pytest.raises(torchkiln.EngineInputError, match=r"expects 1 inputs \('x'\), got 2"):
        engine.execute([torch.randn(2, 64), torch.randn(2, 64)])


def test_not_a_tensor(compiled):
    engine = engine_from_blob(compiled._torchkiln_engine_0)
    with pytest.raises(torchkiln.EngineInputError, match="expected a tensor, got list"):
        engine.execute([[1.0, 2.0]])


def test_correct_inputs_still_work_after_errors(compiled):
    x = torch.randn(2, 64)
    torch.testing.assert_close(compiled(x), compiled(x.clone()), rtol=0, atol=0)


def test_requires_grad_and_non_contiguous_inputs(compiled):
    model = MLP().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((2, 64))])
    x = torch.randn(64, 2).t().requires_grad_()
    out = compiled(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-5, atol=1e-6)
