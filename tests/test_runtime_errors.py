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
    with pytest.raises(RuntimeError, match=r"engine input 0 \('x'\): expected shape \(2, 64\), got \(3, 64\)"):
        compiled(torch.randn(3, 64))


def test_wrong_rank(compiled):
    with pytest.raises(RuntimeError, match=r"expected shape \(2, 64\), got \(2, 64, 1\)"):
        compiled(torch.randn(2, 64, 1))


def test_wrong_dtype(compiled):
    with pytest.raises(RuntimeError, match=r"engine input 0 \('x'\): expected dtype torch.float32, got torch.float64"):
        compiled(torch.randn(2, 64, dtype=torch.float64))


def test_wrong_device(compiled):
    engine = engine_from_blob(compiled._torchkiln_engine_0)
    with pytest.raises(RuntimeError, match=r"engine input 0 \('x'\): expected a tensor on cpu, got one on meta"):
        engine.execute([torch.empty(2, 64, device="meta")])


def test_sparse_input(compiled):
    """A sparse tensor of the right shape and dtype passed the checks and failed inside ONNX Runtime's feed (a bare
    RuntimeError about memory formats); it is an input error naming the layout."""
    x = torch.randn(2, 64)
    compiled(x)  # a call that fits first: the one-comparison path must refuse it too
    with pytest.raises(torchkiln.EngineInputError,
                       match=r"engine input 0 \('x'\): expected a dense tensor, got layout torch.sparse_coo"):
        compiled(x.to_sparse())


def test_nested_input(compiled):
    """A nested tensor (eager's linear layers take one) failed inside the input check with torch's internal error
    about its sizes; it is an input error."""
    compiled(torch.randn(2, 64))
    nested = torch.nested.nested_tensor([torch.randn(2, 64), torch.randn(2, 64)])
    with pytest.raises(torchkiln.EngineInputError, match=r"input 0 \('x'\): expected a dense tensor, got a nested"):
        compiled(nested)


@pytest.mark.parametrize("backend", ["onnxruntime", "reference"])
def test_a_negative_view_input_is_read_by_its_values(backend):
    """A tensor with its negative bit set (a lazy negation, `torch._neg_view`) is a dense input: ONNX Runtime's feed
    failed on it (numpy refuses the bit); its values are resolved first."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(4, 8)
    compiled = torchkiln.compile(model, [x], backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(torch._neg_view(x)), model(-x), rtol=0, atol=1e-6)


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


# ---- indices out of range: eager raises, so must the engine (item: no silent wrap-around) ----------

class _Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(4, 3)

    def forward(self, i: torch.Tensor):
        return self.table(i) * 2


class _IndexSelect(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor):
        return x.index_select(0, i) * 2


class _Gather(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor):
        return x.gather(0, i) * 2


class _AdvancedIndex(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor):
        return x[i] * 2


class _AdvancedIndexTwo(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor, j: torch.Tensor):
        return x[i, j] * 2


def _index_case(model, data, good, bad):
    args = [*data, good]
    compiled = torchkiln.compile(model, [t.clone() for t in args], min_block_size=1)
    torch.testing.assert_close(compiled(*args), model(*args), rtol=0, atol=0)
    return compiled, [*data, bad]


X = torch.arange(12.0).reshape(4, 3)


@pytest.mark.parametrize("model, data, good, bad", [
    (_Embed(), [], torch.tensor([0, 3, 1]), torch.tensor([0, -1, 1])),
    (_Embed(), [], torch.tensor([0, 3, 1]), torch.tensor([0, 4, 1])),
    (_IndexSelect(), [X], torch.tensor([0, 3, 1]), torch.tensor([0, -1, 1])),
    (_IndexSelect(), [X], torch.tensor([0, 3, 1]), torch.tensor([4, 0, 1])),
    (_Gather(), [X], torch.tensor([[0, 3, 1]]), torch.tensor([[0, -1, 1]])),
    (_Gather(), [X], torch.tensor([[0, 3, 1]]), torch.tensor([[0, 1, 4]])),
    (_AdvancedIndex(), [X], torch.tensor([0, -1, 1]), torch.tensor([0, 4, 1])),
    (_AdvancedIndex(), [X], torch.tensor([0, -1, 1]), torch.tensor([0, -5, 1])),
], ids=["embedding-neg", "embedding-big", "index_select-neg", "index_select-big", "gather-neg", "gather-big",
        "index-big", "index-too-negative"])
def test_out_of_range_index_raises_like_eager(model, data, good, bad):
    compiled, args = _index_case(model, data, good, bad)
    with pytest.raises((IndexError, RuntimeError)):
        model(*args)
    bad_value = [v for v in bad.flatten().tolist() if not 0 <= v < 4][0]
    with pytest.raises(torchkiln.EngineIndexError, match=rf"gather layer '[^']+'.*index {bad_value} .*0\.\.3"):
        compiled(*args)
    with pytest.raises(IndexError):  # also an IndexError, like eager's
        compiled(*args)


def test_grad_mode_is_as_it_was_after_a_call_and_after_an_error_inside_the_engine():
    compiled, args = _index_case(_Embed(), [], torch.tensor([0, 3, 1]), torch.tensor([0, 4, 1]))
    for enabled in (True, False):
        with torch.set_grad_enabled(enabled):
            assert not compiled(torch.tensor([1, 2, 0])).requires_grad and torch.is_grad_enabled() == enabled
            with pytest.raises(torchkiln.EngineIndexError):
                compiled(*args)
            assert torch.is_grad_enabled() == enabled


def test_inputs_checked_by_one_comparison_still_get_each_documented_error(compiled):
    """After calls that fit (each input compared at once with its dtype and shape), every kind of misfit still
    reaches the check that names it."""
    x = torch.randn(2, 64)
    compiled(x)
    compiled(x)
    for bad, message in [(torch.randn(2, 63), r"expected shape \(2, 64\), got \(2, 63\)"),
                         (x.double(), "expected dtype torch.float32, got torch.float64"),
                         (x.to(torch.float16), "expected dtype torch.float32, got torch.float16"),
                         (torch.randn(64), r"expected shape \(2, 64\), got \(64,\)")]:
        with pytest.raises(torchkiln.EngineInputError, match=message):
            compiled(bad)
    engine = engine_from_blob(compiled._torchkiln_engine_0)
    with pytest.raises(torchkiln.EngineInputError, match=r"expects 1 inputs \('x'\), got 0"):
        engine.execute([])
    with pytest.raises(torchkiln.EngineInputError, match="expected a tensor, got ndarray"):
        engine.execute([x.numpy()])
    parameter = torch.nn.Parameter(x.clone())  # a tensor subclass: checked in full, and taken
    torch.testing.assert_close(engine.execute([parameter])[0], compiled(x), rtol=0, atol=0)


def test_advanced_indexing_wraps_negative_indices_like_eager():
    model = _AdvancedIndexTwo()
    args = [X, torch.tensor([-1, 0, -4]), torch.tensor([2, -3, -1])]
    compiled = torchkiln.compile(model, args, min_block_size=1)
    torch.testing.assert_close(compiled(*args), model(*args), rtol=0, atol=0)
    with pytest.raises(torchkiln.EngineIndexError, match=r"index -4 .*0\.\.2"):
        compiled(X, torch.tensor([0, 0, 0]), torch.tensor([0, -4, 0]))


# ---- errors from inside a compiled module reach the user as torchkiln's types ------------------------

def test_wrong_shape_is_an_engine_input_error(compiled):
    with pytest.raises(torchkiln.EngineInputError, match=r"expected shape \(2, 64\), got \(3, 64\)") as info:
        compiled(torch.randn(3, 64))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
    assert "The following operation failed" not in str(info.value)


def test_engine_input_error_after_save_and_load(compiled, tmp_path):
    torch.jit.save(compiled, tmp_path / "m.ts")
    with pytest.raises(torchkiln.EngineInputError, match=r"expected shape \(2, 64\), got \(3, 64\)"):
        torchkiln.load(tmp_path / "m.ts")(torch.randn(3, 64))
    # torch.jit.load gives TorchScript's own module: the error is a RuntimeError that names the torchkiln type
    with pytest.raises(RuntimeError, match=r"EngineInputError: engine input 0 \('x'\): expected shape"):
        torch.jit.load(tmp_path / "m.ts")(torch.randn(3, 64))


def test_damaged_engine_is_an_engine_format_error():
    compiled = torchkiln.compile(MLP().eval(), [torchkiln.Input((2, 64))])
    blob = compiled._torchkiln_engine_0
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(torchkiln.EngineFormatError):
        compiled(torch.randn(2, 64))


# ---- a module loaded with map_location="meta" has no engine bytes: real inputs are refused -----------------

def test_a_module_loaded_on_meta_refuses_real_inputs(compiled, tmp_path):
    torch.jit.save(compiled, tmp_path / "m.ts")
    on_meta = torchkiln.load(tmp_path / "m.ts", map_location="meta")
    assert on_meta._torchkiln_engine_0.device.type == "meta"
    with pytest.raises(torchkiln.EngineFormatError, match=r"engine attribute is on the meta device.*inputs on cpu"
                                                          r".*map_location='cpu'"):
        on_meta(torch.randn(2, 64))
    with pytest.raises(RuntimeError, match=r"EngineFormatError: the engine attribute is on the meta device"):
        torch.jit.load(tmp_path / "m.ts", map_location="meta")(torch.randn(2, 64))
    out = on_meta(torch.empty(2, 64, device="meta"))  # meta inputs still get the output shapes
    assert out.device.type == "meta" and out.shape == (2, 10)


def test_inputs_on_meta_and_on_the_cpu_together_are_refused(compiled):
    blob = compiled._torchkiln_engine_0
    signature = compiled.graph.findNode("torchkiln::execute_engine").inputsAt(2).toIValue()
    with pytest.raises(torchkiln.EngineInputError, match="must be on one device, got meta and cpu"):
        torch.ops.torchkiln.execute_engine([torch.empty(2, 64, device="meta"), torch.randn(2, 64)], blob, signature)
