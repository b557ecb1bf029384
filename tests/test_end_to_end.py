"""The whole pipeline on real models: compile, run, compare with eager, save and reload."""
import logging
import os
import subprocess
import sys

import pytest
import torch
from harness import assert_matches_eager, check_compiled

import torchkiln
from torchkiln.examples import MLP, SmallResNet

_lib = torch.library.Library("torchkiln_test", "DEF")
_lib.define("mystery(Tensor x) -> Tensor")
_lib.impl("mystery", lambda x: x * torch.sigmoid(x) + 0.5, "CompositeExplicitAutograd")


class WithUnsupportedOp(torch.nn.Module):
    """conv -> relu -> pool | an op no converter knows | linear -> relu -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(2)
        self.fc1 = torch.nn.Linear(32, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.relu(self.conv(x)))
        y = torch.ops.torchkiln_test.mystery(y)
        return self.fc2(torch.relu(self.fc1(torch.flatten(y, 1))))


def test_small_resnet_compiles_to_one_engine():
    check_compiled(SmallResNet(), [torch.randn(2, 3, 64, 64)])


def test_mlp_compiles_to_one_engine():
    check_compiled(MLP(), [torch.randn(8, 64)])


def test_scripted_module_input_is_accepted():
    model = torch.jit.script(MLP().eval())
    check_compiled(model, [torch.randn(3, 64)])


def test_unsupported_op_falls_back_to_pytorch():
    _, report = check_compiled(WithUnsupportedOp(), [torch.randn(2, 3, 16, 16)], engines=2, torch_blocks=1)
    (torch_block,) = [b for b in report.blocks if b.target == "torch"]
    assert torch_block.ops == ("torchkiln_test::mystery",)
    assert torch_block.fallback[0].reason == "no converter or evaluator"


def test_require_full_compilation_names_the_unsupported_op():
    with pytest.raises(torchkiln.UnsupportedOperatorError, match=r"torchkiln_test::mystery x1 .*test_end_to_end.py"):
        torchkiln.compile(WithUnsupportedOp().eval(), [torchkiln.Input((2, 3, 16, 16))], require_full_compilation=True)


def test_require_full_compilation_passes_for_a_convertible_model():
    check_compiled(SmallResNet(), [torch.randn(1, 3, 32, 32)], require_full_compilation=True)


def test_plain_tensors_are_accepted_as_inputs():
    x = torch.randn(4, 64)
    model = MLP().eval()
    compiled = torchkiln.compile(model, [x])
    assert_matches_eager(compiled(x), model(x))


def test_save_and_load_in_a_fresh_process(tmp_path):
    model = SmallResNet().eval()
    x = torch.randn(1, 3, 32, 32)
    compiled = torchkiln.compile(model, [torchkiln.Input((1, 3, 32, 32))])
    torch.jit.save(compiled, tmp_path / "m.ts")
    torch.save({"x": x, "ref": model(x).detach()}, tmp_path / "io.pt")
    script = (
        "import torch, torchkiln\n"
        f"m = torch.jit.load({str(tmp_path / 'm.ts')!r})\n"
        f"io = torch.load({str(tmp_path / 'io.pt')!r}, weights_only=True)\n"
        "out = m(io['x'])\n"
        "err = (out - io['ref']).abs().max().item()\n"
        "assert err <= 1e-4 * io['ref'].abs().max().item(), err\n"
        "print('ok', err)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_debug_logs_each_lowering_pass_graph(caplog):
    with caplog.at_level(logging.DEBUG, logger="torchkiln"):
        torchkiln.compile(MLP().eval(), [torchkiln.Input((2, 64))], debug=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("graph after freeze:\ngraph(") for m in messages)
    assert any(m.startswith("graph after lowering pass remove_dropout") or "lowering pass remove_dropout" in m
               for m in messages)
    assert any(m.startswith("partition report:") for m in messages)
    assert any(m.startswith("converted block") and "network" in m for m in messages)


class IntegerDivision(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x // y).float() * 2 + 1


def test_integer_inputs_are_safe_divisors_during_shape_analysis():
    x, y = torch.randint(-5, 5, (3, 4)), torch.randint(1, 4, (3, 4))
    specs = [torchkiln.Input((3, 4), dtype=torch.int64)] * 2
    check_compiled(IntegerDivision(), [x, y], inputs=specs, min_block_size=1, engines=None, torch_blocks=None)


def test_example_tensors_given_as_inputs_drive_shape_analysis():
    spec = torchkiln.Input.from_tensor(torch.full((2, 3), 7))
    assert torch.equal(spec.example(torch.device("cpu")), torch.full((2, 3), 7))
    assert spec == torchkiln.Input((2, 3), dtype=torch.int64)  # the data is not part of the spec


class TracedShapeArithmetic(torch.nn.Module):
    """Traced, `x.size(0) * 2` becomes 0-d tensor arithmetic (NumToTensor, mul, Int) that must fold at build time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).reshape(x.size(0) * 2, -1) + 1


def test_traced_shape_arithmetic_folds_at_build_time():
    x = torch.randn(4, 6)
    traced = torch.jit.trace(TracedShapeArithmetic(), (x,))
    assert "aten::mul" in str(traced.graph)
    _, report = check_compiled(traced, [x], min_block_size=1)
    assert "aten::mul.Tensor" not in report.blocks[0].ops  # folded: not a layer


class ScriptedInterpolate(torch.nn.Module):
    """Scripted F.interpolate loops over the input's spatial dims: unrolled once shapes are known."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(torch.relu(x), scale_factor=2.0, mode="bilinear") * 2


def test_loop_over_a_shape_is_unrolled_after_shape_analysis():
    _, report = check_compiled(ScriptedInterpolate(), [torch.randn(1, 2, 5, 7)], min_block_size=1)
    assert "aten::upsample_bilinear2d.vec" in report.blocks[0].ops


@pytest.mark.parametrize("truncate", [False, True])
def test_float64_model_with_and_without_truncation(truncate):
    """float64 runs natively; truncate_long_and_double runs 32-bit inside (weights too) and returns float64."""
    model = SmallResNet().double()
    rtol = 1e-4 if truncate else 1e-10
    check_compiled(model, [torch.randn(1, 3, 32, 32, dtype=torch.float64)], truncate_long_and_double=truncate,
                   rtol=rtol)
