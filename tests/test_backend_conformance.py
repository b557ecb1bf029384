"""Backend conformance: every layer kind on every backend that runs here (reference, onnxruntime and, with a GPU,
cuda) against the reference meanings, with special values: NaN, +-inf, signed zeros, extreme magnitudes (1e30,
1e-30, float16's largest), 0-d and empty tensors, fully masked attention and softmax rows. Values, NaN and inf
positions, shapes and dtypes must agree. A backend that cannot take a case refuses the layer at build (it then runs
on the reference meaning inside the engine: the comparison checks that path too) or, for values its kernels take
otherwise, computes that call on the reference; it never returns another value, and ONNX Runtime never fails at run
time. (`tests/test_runtime_backends.py` runs the same kinds' cases on plain random data.)"""
from __future__ import annotations

import logging

import pytest
import torch
from harness import FP32_RTOL, assert_matches_eager
from test_onnx_export import ALL_CASES, Build, carried_body, case, scalar, subnetwork
from test_runtime_backends import engine_of

from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.backends import BACKENDS
from torchkiln.runtime.executor import ReferenceExecutor

F32, F16, I64, B = torch.float32, torch.float16, torch.int64, torch.bool
INF, NAN = float("inf"), float("nan")
E, U, A, R = L.ElementWiseOperation, L.UnaryOperation, L.ActivationType, L.ReduceOperation

# Values no backend is compared on, and why: what torch gives there depends on its CPU vector path, so no other
# implementation can be held to it.
VECTOR_PATH = {
    "activation-GELU": ("inf", "torch's GELU(+inf) is +inf or NaN depending on the CPU's vector path"),
    "normalization-": ("extreme", "the variance of values near 1e30 overflows float32, and what torch's vectorized "
                                  "Welford statistics give then depends on how its lanes combine"),
    "quantize-": ("nan", "NaN has no int8 value: the reference gives the lowest (as ATen), ONNX Runtime's QuantizeLinear "
                         "what its vector path's conversion gives"),
    "dequantize-": ("nan", "NaN has no int8 value (see quantize)"),
}


# Values a backend is not compared on, and why. The cuda backend's generated kernels contract a multiply and an
# add into one fused multiply-add (Triton's default, as Inductor's kernels do): one rounding instead of two, within
# float32's error, but a loop body's c * 1.5 + r at +-1.5e30 then rounds to two values that no longer cancel, and the
# while condition summing them stops after another number of trips than eager's separate roundings.
FUSED_ROUNDING = {("cuda", "loop-"): "extreme"}


def _skipped(name: str, variant: str) -> bool:
    return any(name.startswith(prefix) and what in variant for prefix, (what, _) in VECTOR_PATH.items())


def _special(x: torch.Tensor, values: list[float]) -> torch.Tensor:
    """`x` with `values` written at spread positions (a float input; others are returned as they are)."""
    if not x.dtype.is_floating_point or not x.numel():
        return x
    y = x.clone().view(-1)
    for i, v in enumerate(values):
        y[(i * 7919) % y.numel()] = v
    return y.view(x.shape)


def _variants(name: str, inputs: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Input sets with special values, one float input at a time."""
    out = {}
    for k, x in enumerate(inputs):
        if not x.dtype.is_floating_point or not x.numel():
            continue
        big = torch.finfo(x.dtype).max if x.dtype == F16 else 1e30
        for variant, values in (("nan-inf", [NAN, INF, -INF]), ("extreme", [big, -big, 1e-30, -1e-30]),
                                ("zeros", [0.0, -0.0, 0.0])):
            if not _skipped(name, variant):
                out[f"{variant}@{k}"] = [*inputs[:k], _special(x, values), *inputs[k + 1:]]
    return out


def _finite_where_vector_path(name: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A case whose base data holds infinities torch computes by vector path gets finite values there."""
    if not _skipped(name, "inf"):
        return inputs
    return [torch.where(x.isinf(), torch.full_like(x, 30.0), x) if x.dtype.is_floating_point else x for x in inputs]


# ---- 0-d, empty and fully masked cases, per kind ---------------------------------------------------------------
def _masked_rows(gen: torch.Generator) -> list[torch.Tensor]:
    q, k, v = (torch.randn(s, generator=gen) for s in ((2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 4)))
    return [q, k, v]


def _keep(kind: str) -> torch.Tensor:
    keep = torch.rand(2, 1, 4, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[..., 0] = True
    keep[0, :, 1], keep[1, :, 3] = False, False  # fully masked queries
    return keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, -INF)


def _softmax_rows(gen: torch.Generator) -> list[torch.Tensor]:
    x = torch.randn(4, 5, generator=gen)
    x[1], x[2, :3] = -INF, -INF  # a row of -inf (NaN in torch too) and a partly masked one
    return [x]


def _const(net: Network, value: torch.Tensor):
    return net.add_constant(value).get_output()


S0 = ((), F32)
EXTRA: list[tuple[str, Build]] = [
    case(L.ConstantLayer, "0d", [], lambda n: n.add_constant(torch.tensor(2.5))),
    case(L.ConstantLayer, "empty", [], lambda n: n.add_constant(torch.zeros(2, 0))),
    case(L.FillLayer, "empty", [], lambda n: n.add_fill(0, 0, 1, I64)),
    case(L.IdentityLayer, "0d", [S0], lambda n, x: n.add_identity(x)),
    case(L.CastLayer, "0d", [S0], lambda n, x: n.add_cast(x, I64)),
    case(L.CastLayer, "empty", [((3, 0), F32)], lambda n, x: n.add_cast(x, B)),
    case(L.ShapeLayer, "0d", [S0], lambda n, x: n.add_shape(x)),
    case(L.ShuffleLayer, "permute-0d", [S0], lambda n, x: n.add_shuffle(x, first_transpose=())),
    case(L.ShuffleLayer, "0d-to-1", [S0], lambda n, x: n.add_shuffle(x, reshape_dims=(1, 1))),
    case(L.ShuffleLayer, "1-to-0d", [((1, 1), F32)], lambda n, x: n.add_shuffle(x, reshape_dims=())),
    case(L.ElementWiseLayer, "SUM-0d", [S0, S0], lambda n, a, b: n.add_elementwise(a, b, E.SUM)),
    case(L.ElementWiseLayer, "DIV-empty", [((0, 3), F32), ((3,), F32)], lambda n, a, b: n.add_elementwise(a, b, E.DIV)),
    case(L.ElementWiseLayer, "FLOOR_DIV-f16-max", [((2, 3), F16), ((2, 3), F16)],
         lambda n, a, b: n.add_elementwise(a, b, E.FLOOR_DIV),
         lambda gen: [torch.full((2, 3), 65504.0, dtype=F16), torch.tensor([[0.5, -0.5, 2.0]] * 2, dtype=F16)]),
    case(L.UnaryLayer, "EXP-0d", [S0], lambda n, x: n.add_unary(x, U.EXP)),
    case(L.UnaryLayer, "NEG-empty", [((2, 0), F32)], lambda n, x: n.add_unary(x, U.NEG)),
    case(L.ActivationLayer, "RELU-0d", [S0], lambda n, x: n.add_activation(x, A.RELU)),
    case(L.ActivationLayer, "SIGMOID-empty", [((0, 4), F32)], lambda n, x: n.add_activation(x, A.SIGMOID)),
    case(L.ParametricReLULayer, "shared-0d", [S0], lambda n, x: n.add_parametric_relu(x, torch.tensor([0.25]))),
    case(L.ParametricReLULayer, "channel-empty", [((2, 3, 0), F32)],
         lambda n, x: n.add_parametric_relu(x, torch.rand(3))),
    case(L.ScaleLayer, "uniform-0d", [S0], lambda n, x: n.add_scale(x, L.ScaleMode.UNIFORM, torch.tensor(1.5), None)),
    case(L.ReduceLayer, "SUM-empty-axis", [((2, 0), F32)], lambda n, x: n.add_reduce(x, R.SUM, (1,), False)),
    case(L.ReduceLayer, "PROD-empty-axis", [((2, 0), F32)], lambda n, x: n.add_reduce(x, R.PROD, (1,), True)),
    case(L.ReduceLayer, "ALL-empty-axis", [((0, 3), B)], lambda n, x: n.add_reduce(x, R.ALL, (0,), False)),
    case(L.ReduceLayer, "MAX-empty-rows", [((0, 3), F32)], lambda n, x: n.add_reduce(x, R.MAX, (1,), False)),
    case(L.SoftMaxLayer, "masked-rows", [((4, 5), F32)], lambda n, x: n.add_softmax(x, 1), _softmax_rows),
    case(L.SoftMaxLayer, "log-masked-rows", [((4, 5), F32)], lambda n, x: n.add_softmax(x, 1, True), _softmax_rows),
    case(L.SoftMaxLayer, "empty", [((0, 5), F32)], lambda n, x: n.add_softmax(x, 1)),
    case(L.ConcatenationLayer, "with-empty", [((2, 0), F32), ((2, 3), F32)],
         lambda n, a, b: n.add_concatenation([a, b], 1)),
    case(L.SliceLayer, "empty-input", [((2, 0, 3), F32)], lambda n, x: n.add_slice(x, (1, 0, 1), (1, 0, 2), (1, 1, 1))),
    case(L.ExpandLayer, "0d", [S0], lambda n, x: n.add_expand(x, (2, 3))),
    case(L.ExpandLayer, "to-empty", [((1, 3), F32)], lambda n, x: n.add_expand(x, (0, 3))),
    case(L.GatherLayer, "empty-indices", [((4, 3), F32)],
         lambda n, x: n.add_gather(x, _const(n, torch.zeros(0, dtype=I64)), 0)),
    case(L.ScatterLayer, "0d", [S0, S0], lambda n, x, u: n.add_scatter(x, _const(n, torch.tensor(0)), u, 0)),
    case(L.SelectLayer, "0d", [((), B), S0, S0], lambda n, c, a, b: n.add_select(c, a, b)),
    case(L.SelectLayer, "empty", [((0, 2), B), ((0, 2), F32), ((2,), F32)], lambda n, c, a, b: n.add_select(c, a, b)),
    case(L.TopKLayer, "MIN-k1-all-nan-row", [((3, 4), F32)], lambda n, x: n.add_topk(x, L.TopKOperation.MIN, 1, 1),
         lambda gen: [torch.tensor([[NAN] * 4, [1.0, NAN, -INF, 2.0], [3.0, 1.0, 1.0, 0.5]])]),
    case(L.PaddingLayer, "replicate-to-empty", [((1, 2, 4, 5), F32)],
         lambda n, x: n.add_padding(x, (1, 2, -2, -2), L.PaddingMode.REPLICATE)),
    case(L.PaddingLayer, "reflect-past-a-crop", [((1, 2, 5), F32)],
         lambda n, x: n.add_padding(x, (-3, 2), L.PaddingMode.REFLECT)),
    case(L.CumulativeLayer, "SUM-0d", [S0], lambda n, x: n.add_cumulative(x, L.CumulativeOperation.SUM, 0)),
    case(L.CumulativeLayer, "SUM-empty", [((0, 3), F32)],
         lambda n, x: n.add_cumulative(x, L.CumulativeOperation.SUM, 0)),
    case(L.MatrixMultiplyLayer, "empty-inner", [((3, 0), F32), ((0, 4), F32)],
         lambda n, a, b: n.add_matrix_multiply(a, L.MatrixOperation.NONE, b, L.MatrixOperation.NONE)),
    case(L.ConvolutionLayer, "transposed-output-padding-past-stride", [((1, 2, 5), F32)],
         lambda n, x: n.add_convolution_nd(x, torch.randn(2, 3, 3), torch.randn(3), stride=(1,), padding=(0,),
                                           dilation=(2,), transposed=True, output_padding=(1,))),
    case(L.ConvolutionLayer, "empty-batch", [((0, 2, 5, 5), F32)],
         lambda n, x: n.add_convolution_nd(x, torch.randn(3, 2, 3, 3), None, stride=(1, 1), padding=(1, 1),
                                           dilation=(1, 1))),
    case(L.PoolingLayer, "max-empty-batch", [((0, 2, 4, 4), F32)],
         lambda n, x: n.add_pooling_nd(x, L.PoolingType.MAX, (2, 2), stride=(2, 2), padding=(0, 0))),
    case(L.NormalizationLayer, "layer-empty-rows", [((0, 8), F32)],
         lambda n, x: n.add_normalization(x, L.NormalizationKind.LAYER, 1e-5, normalized_shape=(8,))),
    case(L.EinsumLayer, "empty", [((2, 0), F32), ((0, 3), F32)], lambda n, a, b: n.add_einsum([a, b], "ij,jk->ik")),
    case(L.ResizeLayer, "bilinear-empty-batch", [((0, 2, 3, 3), F32)],
         lambda n, x: n.add_resize(x, "bilinear", scales=(2.0, 2.0), align_corners=False)),
    case(L.GridSampleLayer, "empty-grid", [((1, 2, 4, 4), F32), ((1, 0, 3, 2), F32)],
         lambda n, x, g: n.add_grid_sample(x, g, "bilinear", "zeros", False)),
    *[case(L.AttentionLayer, f"masked-rows-{kind}", [((2, 2, 4, 8), F32), ((2, 2, 5, 8), F32), ((2, 2, 5, 4), F32)],
           lambda n, q, k, v, kind=kind: n.add_attention(q, k, v, _const(n, _keep(kind))), _masked_rows)
      for kind in ("bool", "float")],
    case(L.AttentionLayer, "every-key-masked", [((1, 2, 3, 4), F32), ((1, 2, 5, 4), F32), ((1, 2, 5, 4), F32)],
         lambda n, q, k, v: n.add_attention(q, k, v, _const(n, torch.zeros(3, 5, dtype=B)))),
    case(L.AttentionLayer, "no-keys", [((1, 2, 3, 4), F32), ((1, 2, 0, 4), F32), ((1, 2, 0, 4), F32)],
         lambda n, q, k, v: n.add_attention(q, k, v)),
    case(L.DimValueLayer, "zero", [], lambda n: n.add_layer(L.DimValueLayer, [], value=0, dtype=F32)),
    case(L.NonZeroLayer, "specials", [((2, 4), F32)], lambda n, x: n.add_non_zero(x),  # NaN and inf are nonzero
         lambda gen: [torch.tensor([[0.0, -0.0, NAN, INF], [-INF, 1e-30, 0.0, -1.0]])]),
    case(L.NonZeroLayer, "empty", [((0, 3), F32)], lambda n, x: n.add_non_zero(x)),
    case(L.UniqueLayer, "specials", [((9,), F32)], lambda n, x: n.add_unique(x),
         lambda gen: [torch.tensor([NAN, 1.0, -INF, NAN, INF, 1.0, 2.5, -INF, 1e30])]),
    case(L.UniqueLayer, "consecutive-specials", [((8,), F32)], lambda n, x: n.add_unique(x, consecutive=True),
         lambda gen: [torch.tensor([NAN, NAN, 1.0, 1.0, INF, INF, -1.0, 1.0])]),
    case(L.UniqueLayer, "empty", [((0, 2), I64)], lambda n, x: n.add_unique(x)),
    case(L.ConditionalLayer, "empty", [((), B), ((0, 3), F32)],
         lambda n, p, x: n.add_conditional(
             p, [x], subnetwork("then", [((0, 3), F32)], lambda m, a: m.add_unary(a, U.EXP).get_output()),
             subnetwork("else", [((0, 3), F32)], lambda m, a: a))),
    case(L.LoopLayer, "zero-trips", [((4,), F32), ((4,), F32)],
         lambda n, x, r: n.add_loop(scalar(n, 0), scalar(n, True), [x], [r], carried_body(2.0, None), 0)),
    case(L.LoopLayer, "beyond-max-trips", [((4,), F32), ((4,), F32)],  # the meaning's EngineInputError on each backend
         lambda n, x, r: n.add_loop(scalar(n, 1 << 62), scalar(n, True), [x], [r], carried_body(1.0, 1e30), 20),
         lambda gen: [torch.zeros(4), torch.ones(4)]),
]

CASES_BY_KIND: dict[str, list[tuple[str, Build]]] = {}
for _name, _build in [*ALL_CASES, *EXTRA]:
    CASES_BY_KIND.setdefault(_name.split("-")[0], []).append((_name, _build))


def test_every_layer_kind_has_special_cases():
    assert set(CASES_BY_KIND) == set(L.LAYER_KINDS), set(L.LAYER_KINDS) ^ set(CASES_BY_KIND)


def _reference(net: Network, inputs: list[torch.Tensor], device: str) -> list[torch.Tensor] | Exception | None:
    """The reference meanings on `device` (None: torch has no kernel for a layer there, so eager cannot run it)."""
    try:
        return [o.cpu() for o in ReferenceExecutor(net, torch.device(device)).run([x.to(device) for x in inputs])]
    except NotImplementedError:
        return None
    except Exception as e:  # the error every backend must raise too
        return e


def assert_conforms(out: list[torch.Tensor], ref: list[torch.Tensor], rtol: float, path: str) -> None:
    """Shapes, dtypes, NaN positions and signed infinities exactly; finite values within rtol x max|ref|."""
    assert len(out) == len(ref), f"{path}: {len(out)} outputs, reference {len(ref)}"
    for i, (o, r) in enumerate(zip(out, ref)):
        where = f"{path}[{i}]"
        assert (o.shape, o.dtype) == (r.shape, r.dtype), f"{where}: {o.dtype}{list(o.shape)}, {r.dtype}{list(r.shape)}"
        if r.dtype.is_floating_point:
            nan = o.isnan() != r.isnan()
            assert not nan.any(), f"{where}: NaN positions differ at {nan.nonzero()[:4].tolist()}"
            inf = r.isinf()
            assert torch.equal(o.isinf(), inf) and torch.equal(o[inf], r[inf]), f"{where}: infinities differ"
        assert_matches_eager(o, r, rtol, where)


@pytest.mark.parametrize("kind", sorted(CASES_BY_KIND))
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_layer_kind_conforms_on_special_values(backend, kind, caplog):
    device = "cuda" if "cpu" not in BACKENDS[backend].devices else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        for name, build in CASES_BY_KIND[kind]:
            net, inputs = build(torch.Generator().manual_seed(0))
            inputs = _finite_where_vector_path(name, inputs)
            runs = _variants(name, inputs) if (name, build) in ALL_CASES else {"special": inputs}
            engine = engine_of(net, backend, device)
            for variant, xs in runs.items():
                if any(backend == b and name.startswith(prefix) and what in variant
                       for (b, prefix), what in FUSED_ROUNDING.items()):
                    continue
                path = f"{name} {variant} on {backend}"
                ref = _reference(net, xs, device)
                if ref is None:
                    continue
                if isinstance(ref, Exception):
                    if device == "cpu":  # on CUDA a bad index trips a device-side assertion, which ends CUDA here
                        with pytest.raises(type(ref)):
                            engine.execute(xs)
                    continue
                half = device == "cuda" and any(t.dtype in (F16, torch.bfloat16) for layer in net.layers
                                                for t in layer.outputs)
                out = [o.cpu() for o in engine.execute([x.to(device) for x in xs])]
                assert_conforms(out, ref, 8e-3 if half else FP32_RTOL, path)
    assert "ONNX Runtime failed" not in caplog.text, caplog.text


def test_refused_layers_say_why_and_run_on_the_reference():
    """The onnxruntime backend refuses at build what ORT cannot take (the comparisons above checked the answers)."""
    refused = {name: engine_of(build(torch.Generator())[0], "onnxruntime").reference_layers()
               for name, build in EXTRA if "past" in name or name == "scatter-0d"}
    assert all(found and all(reason for _, _, reason in found) for found in refused.values()), refused
