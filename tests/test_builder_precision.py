"""Precision lowering (fp16/bf16 engines): the model's fp32 casts stay fp32, and reductions, softmax,
normalization, cumulative ops, exp and powers compute in fp32 by rule, where plain fp16 overflows or
loses the answer. Each compiled case also shows that the naive fp16 computation misses."""
import pytest
import torch
import torch.nn.functional as F

import torchkiln
from torchkiln.builder import BuildSettings
from torchkiln.builder.passes.precision import lower_precision
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.engine import Engine, InputBinding

F16, F32 = torch.float16, torch.float32


def _bindings(net):
    return [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in net.inputs]


def _matches(out, ref, rtol=1e-3):
    """Within fp16 tolerance of the fp32 answer: finite, cosine >= 0.999, max abs error <= rtol x max|ref|."""
    out, ref = out.double().flatten(), ref.double().flatten()
    if not torch.isfinite(out).all():
        return False
    cosine = F.cosine_similarity(out, ref, dim=0).item()
    return cosine >= 0.999 and (out - ref).abs().max().item() <= rtol * ref.abs().max().item()


def _compile_fp16(fn, x):
    class M(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    return torchkiln.compile(M(), [torchkiln.Input(x.shape)], enabled_precisions={F16}, min_block_size=1,
                             require_full_compilation=True)


def _sum(x):
    return x.sum(-1)


def _cumsum(x):
    return torch.cumsum(x, -1)[:, -1]


def _log_sum_exp(x):
    return torch.log(torch.exp(x).sum(-1))


def _softmax(x):
    return torch.softmax(x, -1)


def _layer_norm(x):
    return F.layer_norm(x, (256,))


def _rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


CASES = {
    "sum of 70000": (_sum, lambda: torch.rand(2, 70000) + 0.5),  # ~70000 > fp16's max 65504
    "cumsum of 70000": (_cumsum, lambda: torch.rand(2, 70000) + 0.5),
    "log-sum-exp of 12s": (_log_sum_exp, lambda: torch.randn(4, 64) + 12),  # exp(12) > 65504
    "softmax of large logits": (_softmax, lambda: torch.randn(4, 16) * 2 + 1000),  # fp16 steps 0.5 there
    "layer norm of 300s": (_layer_norm, lambda: torch.randn(4, 256) * 3 + 300),  # x**2 > 65504
    "rms norm by hand": (_rms_norm, lambda: torch.randn(4, 256) * 3 + 300),
}


@pytest.mark.parametrize("case", CASES)
def test_fp16_engine_keeps_sensitive_layers_in_fp32(case):
    fn, make = CASES[case]
    torch.manual_seed(0)
    x = make()
    ref = fn(x)
    out = _compile_fp16(fn, x)(x)
    assert out.dtype == F32
    assert _matches(out, ref), f"{case}: engine misses fp32 eager: max error {(out - ref).abs().max():.3e}"
    naive = fn(x.half())
    assert not _matches(naive, ref), f"{case}: the case is too easy: plain fp16 passes"


class _HalfModelWithFloatRegion(torch.nn.Module):
    """A half model that widens to fp32 where fp16 would overflow, as mixed-precision models do."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        h = self.proj(x).float() * 300.0  # ~300s: squares and dot products leave fp16's range
        energy = (h * h).mean(-1, keepdim=True)
        scores = torch.matmul(h, h.transpose(-1, -2)) / energy
        return scores.half(), (h / energy.sqrt()).half()


def test_the_models_explicit_float_region_stays_fp32():
    torch.manual_seed(0)
    model = _HalfModelWithFloatRegion().half().eval()
    x = torch.randn(2, 8, 64).half()
    with torch.no_grad():
        ref = model(x)
        compiled = torchkiln.compile(model, [torchkiln.Input(x.shape, dtype=F16)], enabled_precisions={F16},
                                     require_full_compilation=True)
        out = compiled(x)
    for o, r in zip(out, ref):
        assert o.dtype == F16 and torch.isfinite(r).all()
        assert _matches(o.float(), r.float(), rtol=2e-3)


def test_a_cast_to_fp32_keeps_its_region_fp32_until_the_model_casts_back():
    n = Network()
    x = n.add_input("x", F16, (4, 8))
    wide = n.add_cast(x, F32)
    square = n.add_elementwise(wide.get_output(), wide.get_output(), L.ElementWiseOperation.PROD)
    scaled = n.add_elementwise(square.get_output(), n.add_constant(torch.tensor(1e-3)).get_output(),
                               L.ElementWiseOperation.PROD)
    back = n.add_cast(scaled.get_output(), F16)
    n.mark_output(back.get_output())
    assert lower_precision(n, BuildSettings(compute_dtype=F16)) is False  # nothing to narrow
    assert wide.to_type == F32 and square.get_output().dtype == F32 and scaled.get_output().dtype == F32
    assert back.get_output().dtype == F16
    x_in = torch.full((4, 8), 300.0, dtype=F16)  # 300**2 = 90000 overflows fp16
    out = Engine(n, _bindings(n), "cpu", F32).execute([x_in])[0]
    assert torch.equal(out, torch.full((4, 8), 90.0, dtype=F16))


def _one_layer(add):
    n = Network()
    x = n.add_input("x", F32, (2, 8, 16))
    layer = add(n, x)
    n.mark_output(layer.get_output())
    return n, layer


FP32_BY_RULE = {
    "softmax": lambda n, x: n.add_softmax(x, 2),
    "layer norm": lambda n, x: n.add_normalization(x, L.NormalizationKind.LAYER, 1e-5, torch.rand(16),
                                                   torch.randn(16), normalized_shape=(16,)),
    "group norm": lambda n, x: n.add_normalization(x, L.NormalizationKind.GROUP, 1e-5, torch.rand(8),
                                                   torch.randn(8), num_groups=2),
    "instance norm": lambda n, x: n.add_normalization(x, L.NormalizationKind.INSTANCE, 1e-5),
    "sum": lambda n, x: n.add_reduce(x, L.ReduceOperation.SUM, (2,), False),
    "mean": lambda n, x: n.add_reduce(x, L.ReduceOperation.AVG, (1, 2), True),
    "prod": lambda n, x: n.add_reduce(x, L.ReduceOperation.PROD, (2,), False),
    "cumsum": lambda n, x: n.add_cumulative(x, L.CumulativeOperation.SUM, 2),
    "cumprod": lambda n, x: n.add_cumulative(x, L.CumulativeOperation.PROD, 1),
    "exp": lambda n, x: n.add_unary(x, L.UnaryOperation.EXP),
    "square": lambda n, x: n.add_unary(x, L.UnaryOperation.SQUARE),
    "pow": lambda n, x: n.add_elementwise(x, n.add_constant(torch.tensor(3.0)).get_output(),
                                          L.ElementWiseOperation.POW),
}


@pytest.mark.parametrize("kind", FP32_BY_RULE)
def test_sensitive_layers_compute_in_fp32_with_fp32_weights(kind):
    n, layer = _one_layer(FP32_BY_RULE[kind])
    lower_precision(n, BuildSettings(compute_dtype=F16))
    assert all(t.dtype == F32 for t in layer.inputs) and layer.get_output().dtype == F32
    assert all(w.dtype == F32 for w in layer.weights.values())


def test_a_rule_result_is_narrowed_again_by_the_next_matrix_multiply():
    n = Network()
    x = n.add_input("x", F32, (4, 16))
    total = n.add_reduce(x, L.ReduceOperation.SUM, (1,), True)
    shifted = n.add_elementwise(x, total.get_output(), L.ElementWiseOperation.SUB)  # fp32: reads a sum
    mm = n.add_matrix_multiply(shifted.get_output(), L.MatrixOperation.NONE,
                               n.add_constant(torch.randn(16, 8)).get_output(), L.MatrixOperation.NONE)
    relu = n.add_activation(mm.get_output(), L.ActivationType.RELU)
    n.mark_output(relu.get_output())
    assert lower_precision(n, BuildSettings(compute_dtype=F16))
    assert shifted.get_output().dtype == F32
    assert [t.dtype for t in mm.inputs] == [F16, F16] and relu.get_output().dtype == F16
    assert n.outputs[0].dtype == F32 and n.outputs[0].producer.KIND == "cast"


def test_calibration_builds_its_reference_from_the_block_already_converted(monkeypatch):
    """A calibrated fp16 build converts the block twice, not three times: its fp32 reference is the network the
    block was first converted into (a conversion copies every weight)."""
    import torchkiln.compiler as compiler

    calls = []
    real = compiler.convert_block
    monkeypatch.setattr(compiler, "convert_block", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    compiled = torchkiln.compile(model, [torchkiln.Input(x.shape)], enabled_precisions={F16}, backend="reference")
    assert len(calls) == 2
    ref = model(x)
    assert _matches(compiled(x).float(), ref, 1e-2)


class _LayerScaled(torch.nn.Module):
    """Residual blocks whose branches are scaled by 1e-6 (ConvNeXt's and EdgeNeXt's layer scale at init): each
    branch's value is subnormal in fp16, and its error vanishes in the sum. With `shift`, each branch instead
    adds and subtracts 1000, where fp16's step is 0.5: an error the sum does not absorb."""

    def __init__(self, shift: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
        self.gamma = torch.nn.Parameter(torch.full((32,), 1e-6))
        self.shift = shift

    def forward(self, x):
        for fc in self.fc:
            h = torch.relu(fc(x))
            x = x + ((h + 1000.0) - 1000.0 if self.shift else self.gamma * h)
        return x


def _compile_fp16_model(model, x):
    return torchkiln.compile(model.eval(), [torchkiln.Input(x.shape)], enabled_precisions={F16}, min_block_size=1,
                             require_full_compilation=True, backend="reference")


def test_a_branch_whose_error_a_residual_sum_absorbs_stays_fp16(caplog):
    """Judged on its own scale the scaled branch loses precision; against the sum it lands in, it does not."""
    torch.manual_seed(0)
    model, x = _LayerScaled(), torch.randn(8, 32)
    with caplog.at_level("INFO", logger="torchkiln"):
        out = _compile_fp16_model(model, x)(x)
    assert "kept in float32" not in caplog.text
    assert _matches(out, model(x))


def test_a_branch_whose_error_its_sum_does_not_absorb_is_kept_in_fp32(caplog):
    torch.manual_seed(0)
    model, x = _LayerScaled(shift=True), torch.randn(8, 32)
    with caplog.at_level("INFO", logger="torchkiln"):
        out = _compile_fp16_model(model, x)(x)
    assert "kept in float32" in caplog.text
    assert _matches(out, model(x))
    assert not _matches(model.half()(x.half()).float(), model.float()(x)), "the case is too easy in plain fp16"


class _BranchReturned(torch.nn.Module):
    """A layer-scaled branch added to its residual and returned as well: as an output it is judged on its own scale."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.gamma = torch.nn.Parameter(torch.full((32,), 1e-6))

    def forward(self, x):
        branch = self.gamma * torch.relu(self.fc(x))
        return x + branch, branch.reshape(-1)


def test_a_branch_that_is_also_returned_is_not_absorbed_by_its_sum():
    torch.manual_seed(0)
    model, x = _BranchReturned().eval(), torch.randn(8, 32)
    total, branch = _compile_fp16_model(model, x)(x)
    ref_total, ref_branch = model(x)
    assert _matches(total, ref_total) and _matches(branch, ref_branch)
