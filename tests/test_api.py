"""Public API beyond compile: engines as bytes, embedding, support checks."""
import pytest
import torch
from harness import assert_matches_eager, check_compiled

import torchkiln
from torchkiln.examples import MLP, SmallResNet
from test_end_to_end import WithUnsupportedOp


class TwoOutputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return torch.relu(x) + y, torch.sigmoid(x * y)


def test_convert_method_to_engine_and_embed():
    model = SmallResNet().eval()
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((2, 3, 32, 32))])
    assert isinstance(data, bytes)
    module = torchkiln.embed_engine_in_new_module(data)
    x = torch.randn(2, 3, 32, 32)
    assert_matches_eager(module(x), model(x))


def test_a_method_input_never_read_is_still_an_engine_binding():
    """forward(x, unused): the whole-method engine takes both inputs (before, shape analysis skipped the unread one
    and conversion failed with a KeyError deep inside)."""
    class Unread(torch.nn.Module):
        def forward(self, x, unused):
            return torch.exp(x) * 2

    model = Unread().eval()
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((4, 8)), torchkiln.Input((8, 8))])
    x, other = torch.randn(4, 8), torch.randn(8, 8)
    assert_matches_eager(torchkiln.embed_engine_in_new_module(data)(x, other), model(x, other))


def test_embedded_engine_with_two_inputs_and_outputs(tmp_path):
    model = TwoOutputs()
    specs = [torchkiln.Input((3, 5)), torchkiln.Input((3, 5))]
    data = torchkiln.convert_method_to_engine(model, "forward", specs)
    module = torchkiln.embed_engine_in_new_module(data, input_binding_names=["x", "input_1"])
    torch.jit.save(module, tmp_path / "e.ts")
    loaded = torch.jit.load(tmp_path / "e.ts")
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    assert_matches_eager(loaded(x, y), model(x, y))
    # the names order the bindings: forward(y, x) returning (sigmoid, sum)
    swapped = torchkiln.embed_engine_in_new_module(data, ["y", "x"], ["output_1", "output_0"])
    assert_matches_eager(swapped(y, x), model(x, y)[::-1])


class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(10, 5), torch.nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


@pytest.mark.parametrize("inputs,outputs,message", [
    (["x.1"], ["output_0"], r"input_binding_names: 'x.1' is not an input binding of the engine; its inputs are "
                            r"\['x'\] \(by position input_0\)"),
    (["input_0"], ["z.1"], r"output_binding_names: 'z.1' is not an output binding"),
    (["input_1"], None, r"'input_1' is not an input binding"),
    (["x", "x"], None, r"the engine has 1 inputs \['x'\], got \['x', 'x'\]"),
])
def test_names_that_are_not_the_engines_bindings_are_refused(inputs, outputs, message):
    """Torch-TensorRT's test_detect_invalid_input_binding / _output_binding: a name that is no binding raises
    RuntimeError (EngineInputError is one)."""
    model = TwoLinear().eval()
    data = torchkiln.convert_method_to_trt_engine(torch.jit.script(model), "forward", inputs=[torchkiln.Input((2, 10))])
    with pytest.raises(torchkiln.EngineInputError, match=message) as info:
        torchkiln.embed_engine_in_new_module(data, input_binding_names=inputs, output_binding_names=outputs)
    assert isinstance(info.value, RuntimeError)
    module = torchkiln.embed_engine_in_new_module(data, input_binding_names=["input_0"],
                                                  output_binding_names=["output_0"])
    x = torch.randn(2, 10)
    with torch.no_grad():
        assert_matches_eager(module(x), model(x))


def test_check_method_op_support():
    assert torchkiln.check_method_op_support(MLP().eval())
    assert not torchkiln.check_method_op_support(WithUnsupportedOp().eval())
    assert torchkiln.unsupported_ops(WithUnsupportedOp().eval()) == {"torchkiln_test::mystery": 1}


def test_supported_ops_lists_registries():
    ops = torchkiln.supported_ops()
    assert "aten::relu" in ops["converters"] and "prim::Constant" in ops["evaluators"]


def test_partition_report_is_a_dry_run():
    report = torchkiln.partition_report(WithUnsupportedOp().eval(), [torchkiln.Input((1, 3, 8, 8))])
    assert [b.target for b in report.blocks] == ["engine", "torch", "engine"]
    assert report.fallback_ops == {"torchkiln_test::mystery": 1}
    assert "torchkiln_test::mystery" in str(report)


def test_compile_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match=r"nn.Module.*function"):
        torchkiln.compile(lambda x: x * 2, [torchkiln.Input((2, 3))])


def test_compile_a_script_function():
    @torch.jit.script
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * y + 1

    compiled = torchkiln.compile(fn, [torchkiln.Input((2, 3)), torchkiln.Input((2, 3))], min_block_size=1)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    assert_matches_eager(compiled(x, y), fn(x, y))


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match=r"'nope'.*available.*'forward'"):
        torchkiln.convert_method_to_engine(MLP().eval(), "nope", [torchkiln.Input((2, 64))])


def test_a_containers_len_is_not_a_method_to_compile():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    with pytest.raises(ValueError, match=r"'__len__' of Sequential is the container's own __len__"):
        torchkiln.convert_method_to_engine(model, "__len__", [torchkiln.Input((2, 4))])


class ReservedArgumentNames(torch.nn.Module):
    def forward(self, input: torch.Tensor, outs: torch.Tensor):  # noqa: A002  (a builtin's name, on purpose)
        return torch.relu(input) + outs, torch.sigmoid(input * outs)


def test_binding_names_that_are_not_usable_as_arguments():
    """Bindings named like a builtin or the generated code's own variable still make a forward that runs."""
    model = ReservedArgumentNames()
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((3, 5)), torchkiln.Input((3, 5))])
    for names in (None, ["input", "outs"], ["outs", "input"]):
        module = torchkiln.embed_engine_in_new_module(data, input_binding_names=names)
        x, y = torch.randn(3, 5), torch.randn(3, 5)
        expected = model(x, y) if names != ["outs", "input"] else model(y, x)
        assert_matches_eager(module(x, y), expected)


def test_embedded_engine_raises_torchkiln_errors():
    specs = [torchkiln.Input((3, 5)), torchkiln.Input((3, 5))]
    data = torchkiln.convert_method_to_engine(TwoOutputs(), "forward", specs)
    module = torchkiln.embed_engine_in_new_module(data)
    with pytest.raises(torchkiln.EngineInputError, match=r"engine input 1 \('y'\): expected shape \(3, 5\)"):
        module(torch.randn(3, 5), torch.randn(3, 4))


class OneOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def test_zero_engines_below_min_block_size_warns_with_the_reason():
    with pytest.warns(UserWarning, match=r"OneOp.forward: compiled with 0 engines.*1 engine block below "
                                         r"min_block_size \(min_block_size=3;"):
        check_compiled(OneOp(), [torch.randn(2, 3)], engines=0, torch_blocks=1)


def test_zero_engines_when_everything_is_forced_warns_with_the_reason():
    with pytest.warns(UserWarning, match=r"0 engines.*ops left in PyTorch: 4 forced by torch_executed_ops"):
        check_compiled(TwoOutputs(), [torch.randn(2, 3), torch.randn(2, 3)], engines=0, torch_blocks=1,
                       min_block_size=1, torch_executed_ops=["aten::relu", "aten::sigmoid", "aten::add",
                                                             "aten::mul"])


def test_a_compile_error_names_its_root_cause_in_its_message():
    """The TorchScript interpreter's error starts with a fixed header; the cause is its last line."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    with pytest.raises(ValueError, match=r"inputs: running the method .* failed \(RuntimeError: mat1 and mat2 "
                                         r"shapes cannot be multiplied \(2x7 and 8x4\)\)") as info:
        torchkiln.compile(model, [torchkiln.Input((2, 7))])
    assert "TorchScript interpreter" not in str(info.value)
