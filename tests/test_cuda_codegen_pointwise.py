"""Generated Triton kernels for fused pointwise groups (runtime/backends/cuda/codegen) against the layers' reference
meanings chained: every table row with a Triton expression on real and special values, broadcast bias, channels-last
and non-dense inputs, float16, several outputs, casts, bool values, one kernel for every shape.

On a machine without CUDA the kernels run in Triton's CPU interpreter, which runs no libdevice function: rows whose
expression calls one are checked on CUDA only. fp32: |err| <= 1e-5 * (|ref| + max|ref|). fp16 (the reference rounds
to float16 after every op, the kernel once at the end): |err| <= 1e-3 * max|ref| (seen: 5e-4);
bfloat16 likewise: 8e-3 (seen: 4e-3).
"""
import math

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import EngineInputError, NetworkError  # noqa: E402
from torchkiln.ir import layers as L, pointwise as P  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.ir.symbolic import DimSymbol  # noqa: E402
from torchkiln.ir.reference import run_layer  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen import compile as kernel_files  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.pointwise import compile_group, fusable, generate  # noqa: E402

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy on NaN and inf in the interpreter
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
E, U, A = L.ElementWiseOperation, L.UnaryOperation, L.ActivationType
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.5, 3.0, float("inf"), float("-inf"), float("nan")]


def reference(net: Network, values: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The network's outputs, its layers' reference meanings chained."""
    env = {id(t): values[t.name] for t in net.inputs}
    for layer in net.layers:
        outs = run_layer(layer, [env[id(t)] for t in layer.inputs], layer.weights, DEVICE)
        env.update({id(t): o for t, o in zip(layer.outputs, outs)})
    return [env[id(t)] for t in net.outputs]


def run(net: Network, values: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    launcher = compile_group(net.layers, net.inputs, net.outputs)
    return launcher([values[t.name].to(DEVICE) for t in net.inputs])


def assert_close(got: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5, of_max: float = 1e-5) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    got, ref = got.cpu(), ref.cpu()
    if ref.dtype == torch.bool:
        assert torch.equal(got, ref), (got, ref)
        return
    got, ref = got.double(), ref.double()
    assert torch.equal(got.isnan(), ref.isnan()), (got, ref)
    finite = ref.isfinite()
    assert torch.equal(got[~finite & ~ref.isnan()], ref[~finite & ~ref.isnan()]), (got, ref)
    scale = ref[finite].abs().max().item() if finite.any() else 0.0
    err = (got[finite] - ref[finite]).abs()
    bound = rel * ref[finite].abs() + of_max * scale
    assert bool((err <= bound).all()), f"max error {err.max().item()} (max|ref| {scale})"


def rows(table: dict) -> list:
    """The ops of `table` with a Triton expression; those calling libdevice are skipped without CUDA."""
    skip = pytest.mark.skip(reason="calls libdevice, which Triton's CPU interpreter does not run")
    return [pytest.param(op, marks=() if CUDA or not row.uses_libdevice else skip, id=op.name)
            for op, row in table.items() if row.triton is not None]


def _grid(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair of special values, and random pairs."""
    special = torch.tensor(values)
    a, b = torch.cartesian_prod(special, special).unbind(1)
    gen = torch.Generator().manual_seed(0)
    ra, rb = (torch.rand(64, generator=gen) * 8 - 4 for _ in range(2))
    return torch.cat([a, ra]), torch.cat([b, rb])


@pytest.mark.parametrize("op", rows(P.ELEMENTWISE))
def test_binary_row_matches_reference(op):
    a, b = _grid(SPECIAL)
    net = Network()
    x, y = net.add_input("a", F32, a.shape), net.add_input("b", F32, b.shape)
    net.mark_output(net.add_elementwise(x, y, op).get_output())
    assert_close(run(net, {"a": a, "b": b})[0], reference(net, {"a": a, "b": b})[0])


def _unary_values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.cat([torch.tensor(SPECIAL + [0.3, -0.7, 0.99, -0.99, 1e-3, 20.0, -20.0, 100.0, -100.0]),
                      torch.rand(64, generator=gen) * 8 - 4])


@pytest.mark.parametrize("op", rows(P.UNARY))
def test_unary_row_matches_reference(op):
    x = _unary_values()
    net = Network()
    net.mark_output(net.add_unary(net.add_input("x", F32, x.shape), op).get_output())
    assert_close(run(net, {"x": x})[0], reference(net, {"x": x})[0])


PARAMS = {A.LEAKY_RELU: (0.1, 0.0), A.ELU: (1.3, 0.0), A.CELU: (0.7, 0.0), A.SOFTPLUS: (2.0, 5.0),
          A.CLIP: (-1.5, math.inf), A.HARD_TANH: (-1.0, 2.0), A.THRESHOLDED_RELU: (0.5, -2.0)}


@pytest.mark.parametrize("kind", rows(P.ACTIVATION))
def test_activation_row_matches_reference(kind):
    x = _unary_values()
    if kind == A.GELU_ERF:  # torch's GELU of +inf is inf or NaN by the element's place in its vectorized loop
        x = x[x != math.inf]
    net = Network()
    net.mark_output(net.add_activation(net.add_input("x", F32, x.shape), kind, *PARAMS.get(kind, (0.0, 0.0)))
                    .get_output())
    assert_close(run(net, {"x": x})[0], reference(net, {"x": x})[0])


def _ulps(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| in units in the last place of float32 at ref (a float64 value); the smallest subnormal at least."""
    exponent = torch.frexp(ref.abs().float())[1].double()
    ulp = torch.ldexp(torch.ones_like(ref), torch.clamp(exponent - 24, min=-149))
    return (got.double() - ref).abs() / ulp


def test_erf_is_within_two_ulp_of_float64():
    """The generated kernels' erf (`_erf`, two polynomials and an exp2; the ERF row and GELU use it) against float64
    erf: random float32 bit patterns (every binade below 6, where erf rounds to +-1 from 3.92), uniform values, and
    the edges of its two pieces and of its clamp."""
    gen = torch.Generator().manual_seed(3)
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (1 << 17,), generator=gen, dtype=torch.int32).view(F32)
    edges = torch.tensor([0.875, -0.875, 0.87499994, -0.87499994, 3.92, 4.0, 4.0000005, 6.0, 1e-30, -1e-30])
    x = torch.cat([bits[bits.abs() < 6], torch.rand(1 << 15, generator=gen) * 10 - 5, edges])
    net = Network()
    net.mark_output(net.add_unary(net.add_input("x", F32, x.shape), L.UnaryOperation.ERF).get_output())
    got = run(net, {"x": x})[0].cpu()
    err = _ulps(got, torch.erf(x.double()))
    assert err.max().item() <= 2.0, (err.max().item(), x[err.argmax()].item())
    assert torch.equal(got[-10:].sign(), x[-10:].sign())


def test_clip_with_an_infinite_lower_bound():
    x = _unary_values()
    net = Network()
    net.mark_output(net.add_activation(net.add_input("x", F32, x.shape), A.CLIP, -math.inf, 1.5).get_output())
    assert_close(run(net, {"x": x})[0], reference(net, {"x": x})[0])


def _epilogue(dtype: torch.dtype, bias_shape: tuple[int, ...]) -> Network:
    """x + bias -> gelu (an output) -> per-channel scale and shift -> relu6 (an output)."""
    net = Network()
    x, bias = net.add_input("x", dtype, (2, 3, 4, 5)), net.add_input("bias", dtype, bias_shape)
    gelu = net.add_activation(net.add_elementwise(x, bias, E.SUM).get_output(), A.GELU_ERF).get_output()
    scaled = net.add_scale(gelu, L.ScaleMode.CHANNEL, scale=torch.tensor([0.5, -1.0, 2.0], dtype=dtype),
                           shift=torch.tensor([0.1, 0.2, -0.3], dtype=dtype)).get_output()
    net.mark_output(gelu)
    net.mark_output(net.add_activation(scaled, A.HARD_TANH, 0.0, 6.0).get_output())
    return net


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
@pytest.mark.parametrize("bias_shape", [(3, 1, 1), (1, 3, 1, 1)], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_fused_epilogue_with_broadcast_bias(dtype, bias_shape, channels_last):
    net = _epilogue(dtype, bias_shape)
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 3, 4, 5, generator=gen) * 3).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    values = {"x": x, "bias": torch.randn(bias_shape, generator=gen).to(dtype)}
    got, ref = run(net, values), reference(net, values)
    for g, r in zip(got, ref):
        if dtype != F32:
            assert_close(g, r, rel=0.0, of_max=1e-3 if dtype == F16 else 8e-3)
        else:
            assert_close(g, r)
        assert g.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def test_outputs_asked_channels_last_from_contiguous_inputs():
    """The planner asks for channels-last outputs where channels-last convolutions read them: a contiguous input is
    then read through its strides (the general path), the outputs written channels-last."""
    net = _epilogue(F32, (3, 1, 1))
    gen = torch.Generator().manual_seed(2)
    values = {"x": torch.randn(2, 3, 4, 5, generator=gen) * 3, "bias": torch.randn(3, 1, 1, generator=gen)}
    launcher = compile_group(net.layers, net.inputs, net.outputs, channels_last=True)
    got = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    for g, r in zip(got, reference(net, values)):
        assert_close(g, r)
        assert g.is_contiguous(memory_format=torch.channels_last) and not g.is_contiguous()


def test_inputs_of_different_layouts_and_a_non_dense_input():
    """Channels-last next to contiguous (the general path), and a strided view (contiguous outputs)."""
    net = Network()
    a, b = net.add_input("a", F32, (2, 3, 4, 5)), net.add_input("b", F32, (2, 3, 4, 5))
    net.mark_output(net.add_elementwise(a, b, E.PROD).get_output())
    gen = torch.Generator().manual_seed(3)
    for a_value, b_value in [
        (torch.randn(2, 3, 4, 5, generator=gen).to(memory_format=torch.channels_last), torch.randn(2, 3, 4, 5)),
        (torch.randn(2, 3, 4, 10, generator=gen)[..., ::2], torch.randn(2, 3, 4, 5)),
    ]:
        values = {"a": a_value, "b": b_value}
        got = run(net, values)[0]
        assert_close(got, reference(net, values)[0])


@pytest.mark.parametrize("per_channel", [False, True], ids=["same-layout", "per-channel"])
def test_whole_programs_with_a_constant_mask_on_either_path(per_channel):
    """A space of whole programs (2 * 4 * 8 * 32 = 2048 elements, two of BLOCK) gets the constant mask: on the
    linear path (a per-channel operand too, read by its lin/div/mod) and on the general one (a strided view), and
    one element more (2049) a masked last program."""
    for shape in ((2, 4, 8, 32), (1, 2049, 1, 1)):
        net = Network()
        b_shape = (1, shape[1], 1, 1) if per_channel else shape
        a, b = net.add_input("a", F32, shape), net.add_input("b", F32, b_shape)
        net.mark_output(net.add_elementwise(a, b, E.SUM).get_output())
        gen = torch.Generator().manual_seed(5)
        wide = torch.randn(*shape[:3], shape[3] * 2, generator=gen)
        for a_value in (torch.randn(shape, generator=gen), wide[..., ::2]):
            values = {"a": a_value, "b": torch.randn(b_shape, generator=gen)}
            assert_close(run(net, values)[0], reference(net, values)[0])


def test_a_per_sample_and_channel_gate_over_a_channels_last_input():
    """x * sigmoid(gate) with a [N, C, 1, 1] gate (squeeze-excitation's): the gate varies along two dims, so the
    general path runs, walking the space in the output's memory order (channels-last here)."""
    net = Network()
    x, gate = net.add_input("x", F32, (2, 6, 3, 5)), net.add_input("gate", F32, (2, 6, 1, 1))
    net.mark_output(net.add_elementwise(x, net.add_activation(gate, A.SIGMOID).get_output(), E.PROD).get_output())
    gen = torch.Generator().manual_seed(4)
    values = {"x": torch.randn(2, 6, 3, 5, generator=gen).to(memory_format=torch.channels_last),
              "gate": torch.randn(2, 6, 1, 1, generator=gen)}
    got = run(net, values)[0]
    assert_close(got, reference(net, values)[0])
    assert got.is_contiguous(memory_format=torch.channels_last)


def test_one_kernel_serves_every_shape():
    def network(shape):
        net = Network()
        x = net.add_input("x", F32, shape)
        net.mark_output(net.add_activation(net.add_unary(x, U.ABS).get_output(), A.SIGMOID).get_output())
        return net

    small, large, dynamic = network((2, 3)), network((5, 7)), network((DimSymbol("n", 1, 64), 7))
    kernel = generate(small.layers, small.inputs, small.outputs)
    for other in (large, dynamic):
        assert kernel.source == generate(other.layers, other.inputs, other.outputs).source
    launcher = compile_group(small.layers, small.inputs, small.outputs)
    for shape in [(2, 3), (5, 7), (1, 1), (0, 4)]:
        x = torch.randn(shape)
        assert_close(launcher([x.to(DEVICE)])[0], reference(small, {"x": x})[0])


def test_casts_round_and_bool_values_flow():
    """A float16 cast rounds mid-chain; comparisons give bool, logical ops read bool and float, bool casts to
    float; a constant joins as a weight."""
    net = Network()
    x, m = net.add_input("x", F32, (4, 6)), net.add_input("m", torch.bool, (6,))
    rounded = net.add_cast(net.add_cast(x, F16).get_output(), F32).get_output()
    net.mark_output(net.add_elementwise(rounded, x, E.SUB).get_output())
    positive = net.add_elementwise(x, net.add_constant(torch.tensor(0.0)).get_output(), E.GREATER).get_output()
    both = net.add_elementwise(positive, m, E.AND).get_output()
    net.mark_output(both)
    net.mark_output(net.add_elementwise(net.add_cast(both, F32).get_output(), x, E.PROD).get_output())
    gen = torch.Generator().manual_seed(4)
    values = {"x": torch.randn(4, 6, generator=gen), "m": torch.rand(6, generator=gen) > 0.5}
    values["x"][0, :3] = torch.tensor([float("nan"), float("inf"), 1e-4])
    for got, ref in zip(run(net, values), reference(net, values)):
        assert_close(got, ref, rel=0.0, of_max=0.0)


@pytest.mark.parametrize("exponent", [2.0, 3.0])
def test_small_constant_powers_are_atens_multiplications(exponent):
    """x ** 2 and x ** 3 by a constant are ATen's multiply chains, so bit-equal to torch.pow (libdevice.pow, which
    Triton's interpreter cannot run, was neither exact to them nor cheap), special values included."""
    net = Network()
    x = net.add_input("x", F32, (4, 11))
    net.mark_output(net.add_elementwise(x, net.add_constant(torch.tensor(exponent)).get_output(), E.POW).get_output())
    values = {"x": torch.cat([torch.randn(4, 11 - len(SPECIAL), generator=torch.Generator().manual_seed(6)) * 40,
                              torch.tensor(SPECIAL).expand(4, -1)], dim=1)}
    got = run(net, values)[0].cpu()
    assert torch.equal(got.isnan(), torch.pow(values["x"], exponent).isnan())
    torch.testing.assert_close(got, torch.pow(values["x"], exponent), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("as_inputs", [False, True], ids=["constant_layers", "group_inputs"])
def test_single_constants_are_written_into_the_source(as_inputs):
    """A tanh-GELU written out in float16 (its constants 0.5, 0.044715, sqrt(2/pi), 1.0 rounded to float16; a
    sigmoid for its tanh, which the interpreter cannot run), plus a -inf and a NaN constant: each constant is a literal of the source, whether a constant layer of the group or
    a group input a constant layer makes elsewhere (still bound, never loaded): the kernel loads x alone, and
    gives the reference's values."""
    net = Network()
    x = net.add_input("x", F16, (3, 40))

    def const(v: float):
        return net.add_constant(torch.tensor(v, dtype=F16)).get_output()

    consts = [const(v) for v in (0.5, 0.044715, math.sqrt(2 / math.pi), 1.0, float("-inf"), float("nan"))]
    half, c3, k, one, ninf, nan = consts
    cube = net.add_elementwise(x, net.add_constant(torch.tensor(3.0, dtype=F16)).get_output(), E.POW).get_output()
    inner = net.add_elementwise(x, net.add_elementwise(cube, c3, E.PROD).get_output(), E.SUM).get_output()
    t = net.add_activation(net.add_elementwise(inner, k, E.PROD).get_output(), A.SIGMOID).get_output()
    gelu = net.add_elementwise(net.add_elementwise(x, half, E.PROD).get_output(),
                               net.add_elementwise(t, one, E.SUM).get_output(), E.PROD).get_output()
    net.mark_output(net.add_elementwise(net.add_elementwise(gelu, ninf, E.MAX).get_output(), nan, E.SUM)
                    .get_output())
    net.mark_output(gelu)
    values = {"x": (torch.randn(3, 40, generator=torch.Generator().manual_seed(8)) * 3).half()}
    if as_inputs:
        made_outside = [layer for layer in net.layers if isinstance(layer, L.ConstantLayer)]
        inside = [layer for layer in net.layers if layer not in made_outside]
        kernel = generate(inside, [x, *(layer.outputs[0] for layer in made_outside)], net.outputs)
    else:
        kernel = generate(net.layers, [x], net.outputs)
    assert kernel.source.count("tl.load(") == 1 and not kernel.weights
    launcher = compile_group(inside if as_inputs else net.layers, kernel.inputs, net.outputs)
    operands = [values["x"].to(DEVICE), *(layer.weights["value"].to(DEVICE) for layer in made_outside)] \
        if as_inputs else [values["x"].to(DEVICE)]
    for got, ref in zip(launcher(operands), reference(net, values)):
        assert_close(got, ref, rel=0.0, of_max=1e-3)


def test_select_of_numbers_and_of_bools():
    """where(m, x, -inf) (a masked fill) with NaN among the taken and the dropped values; where over bools; a
    condition broadcast along rows."""
    net = Network()
    x, m = net.add_input("x", F32, (4, 6)), net.add_input("m", torch.bool, (6,))
    ninf = net.add_constant(torch.tensor(float("-inf"))).get_output()
    net.mark_output(net.add_select(m, x, ninf).get_output())
    positive = net.add_elementwise(x, net.add_constant(torch.tensor(0.0)).get_output(), E.GREATER).get_output()
    net.mark_output(net.add_select(m, positive, net.add_unary(positive, U.NOT).get_output()).get_output())
    gen = torch.Generator().manual_seed(4)
    values = {"x": torch.randn(4, 6, generator=gen), "m": torch.tensor([True, False] * 3)}
    values["x"][0, :2] = float("nan")
    for got, ref in zip(run(net, values), reference(net, values)):
        assert_close(got, ref, rel=0.0, of_max=0.0)


@pytest.mark.parametrize("mode", [L.ScaleMode.UNIFORM, L.ScaleMode.CHANNEL, L.ScaleMode.ELEMENTWISE],
                         ids=lambda m: m.name)
def test_scale_and_prelu_weights(mode):
    shapes = {L.ScaleMode.UNIFORM: (1,), L.ScaleMode.CHANNEL: (3,), L.ScaleMode.ELEMENTWISE: (4, 1)}
    gen = torch.Generator().manual_seed(5)
    weights = {name: torch.rand(shapes[mode], generator=gen) + 0.5 for name in ("scale", "shift")}
    if CUDA:  # the power is libdevice.pow
        weights["power"] = torch.full(shapes[mode], 2.0)
    net = Network()
    x = net.add_input("x", F32, (2, 3, 4, 5))
    scaled = net.add_scale(x, mode, **weights).get_output()
    net.mark_output(net.add_parametric_relu(scaled, torch.tensor([0.1, 0.2, 0.3])).get_output())
    values = {"x": torch.randn(2, 3, 4, 5, generator=gen) * 2 - 1}
    assert_close(run(net, values)[0], reference(net, values)[0])


def test_source_is_deterministic_and_cached_by_its_hash():
    net = _epilogue(F32, (3, 1, 1))
    first, second = (generate(net.layers, net.inputs, net.outputs) for _ in range(2))
    assert first.source == second.source
    module = kernel_files.load_source(first.source)
    assert kernel_files.load_source(second.source) is module
    assert module.__file__.startswith(str(kernel_files.kernel_dir()))
    with open(module.__file__) as f:
        assert f.read() == first.source


def test_what_cannot_be_fused_is_refused_with_the_layer_named():
    net = Network()
    x, i = net.add_input("x", F32, (4,)), net.add_input("i", torch.int64, (4,))
    floor_div = net.add_elementwise(x, x, E.FLOOR_DIV)
    softmax = net.add_softmax(x, 0)
    assert "no Triton expression" in fusable(floor_div)
    assert "softmax" in fusable(softmax)
    assert "float64" in fusable(net.add_unary(net.add_input("d", torch.float64, (4,)), U.ABS))
    with pytest.raises(NetworkError, match=floor_div.name):
        generate([floor_div], [x], floor_div.outputs)
    relu = net.add_activation(x, A.RELU)
    with pytest.raises(NetworkError, match="neither group inputs"):
        generate([relu], [], relu.outputs)


# ---- integer values: ATen's integer semantics (wrap-around, Python's floor division), exact ----

I32, I64 = torch.int32, torch.int64
_LIMITS = {I32: (-2**31, 2**31 - 1), I64: (-2**63, 2**63 - 1)}


def _integers(dtype: torch.dtype) -> torch.Tensor:
    """Small values of both signs, values around sqrt of the limit (products wrap) and at the limits."""
    lo, hi = _LIMITS[dtype]
    root = math.isqrt(hi) + 1
    return torch.tensor([0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, root, -root, hi, hi - 1, lo, lo + 1], dtype=dtype)


def integer_rows(table: dict, divisions: bool) -> list:
    return [pytest.param(op, id=op.name) for op, row in table.items()
            if row.integer is not None and (op in _DIVISIONS) == divisions]


_DIVISIONS = (E.FLOOR_DIV, E.TRUNC_DIV, E.REMAINDER, E.FMOD)


def _assert_exact(net: Network, values: dict[str, torch.Tensor]) -> None:
    got, ref = run(net, values), reference(net, values)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and torch.equal(g.cpu(), r.cpu()), (g, r)


@pytest.mark.parametrize("dtype", [I32, I64], ids=str)
@pytest.mark.parametrize("op", integer_rows(P.ELEMENTWISE, divisions=False))
def test_binary_integer_row_matches_reference_exactly(op, dtype):
    """Every pair of the values: sums and products past the limits wrap as ATen's do."""
    a, b = torch.cartesian_prod(_integers(dtype), _integers(dtype)).unbind(1)
    net = Network()
    x, y = net.add_input("a", dtype, a.shape), net.add_input("b", dtype, b.shape)
    out = net.add_elementwise(x, y, op).get_output()
    net.mark_output(out)
    assert fusable(out.producer) is None
    _assert_exact(net, {"a": a, "b": b})


@pytest.mark.parametrize("dtype", [I32, I64], ids=str)
@pytest.mark.parametrize("op", integer_rows(P.ELEMENTWISE, divisions=True))
def test_integer_division_by_constants_is_pythons(op, dtype):
    """Floor division and remainder round toward -inf on negatives (Python's), truncating ones toward 0; the divisors
    are a constant tensor of both signs without 0 and -1, so the layer is fused."""
    lo, hi = _LIMITS[dtype]
    divisors = torch.tensor([1, 2, -2, 3, -3, 7, -7, 100, hi, lo, lo + 1], dtype=dtype)
    a, b = torch.cartesian_prod(_integers(dtype), divisors).unbind(1)
    net = Network()
    x = net.add_input("a", dtype, a.shape)
    out = net.add_elementwise(x, net.add_constant(b).get_output(), op).get_output()
    net.mark_output(out)
    assert fusable(out.producer) is None
    _assert_exact(net, {"a": a})


@pytest.mark.parametrize("dtype", [I32, I64], ids=str)
@pytest.mark.parametrize("op", integer_rows(P.UNARY, divisions=False))
def test_unary_integer_row_matches_reference_exactly(op, dtype):
    net = Network()
    x = _integers(dtype)
    out = net.add_unary(net.add_input("x", dtype, x.shape), op).get_output()
    net.mark_output(out)
    assert fusable(out.producer) is None
    _assert_exact(net, {"x": x})


@pytest.mark.parametrize("dtype", [I32, I64], ids=str)
@pytest.mark.parametrize("kind,bounds", [(A.RELU, (0.0, 0.0)), (A.CLIP, (-3.0, math.inf)), (A.CLIP, (-math.inf, 5.0)),
                                         (A.HARD_TANH, (-100.0, 7.0))],
                         ids=["relu", "clamp-min", "clamp-max", "hardtanh"])
def test_integer_activation_rows_match_reference_exactly(kind, bounds, dtype):
    net = Network()
    x = _integers(dtype)
    out = net.add_activation(net.add_input("x", dtype, x.shape), kind, *bounds).get_output()
    net.mark_output(out)
    assert out.dtype == dtype and fusable(out.producer) is None
    _assert_exact(net, {"x": x})


def test_integer_division_by_a_run_time_divisor_or_a_zero_stays_on_aten():
    net = Network()
    x, y = net.add_input("x", I32, (4,)), net.add_input("y", I32, (4,))
    assert "run-time divisor" in fusable(net.add_elementwise(x, y, E.FLOOR_DIV))
    for divisor in ([3, 0, 1, 2], [-1]):
        constant = net.add_constant(torch.tensor(divisor, dtype=I32)).get_output()
        assert "0 or -1" in fusable(net.add_elementwise(x, constant, E.REMAINDER))
    wraps_to_zero = net.add_constant(torch.tensor(2**32, dtype=I64).reshape(())).get_output()  # int32 + 0-d: int32
    assert "0 or -1" in fusable(net.add_elementwise(x, wraps_to_zero, E.TRUNC_DIV))
    with pytest.raises(NetworkError, match="run-time divisor"):
        layer = net.add_elementwise(x, y, E.REMAINDER)
        generate([layer], [x, y], layer.outputs)


def test_integer_casts_and_promotions_match_aten():
    """Casts float -> int (toward zero), int -> narrower int (wrapped), int -> float16 (rounded as ATen rounds:
    through float32; not bfloat16 here: the interpreter truncates float32 to bfloat16), bool -> int and int -> bool;
    promotions int32 + int64 -> int64, int32 + a 0-d int64 -> int32 (the 0-d value wrapped), int32 + a 0-d float ->
    float32, bool + int -> int, an int32 compared with its float16 cast in float16 (equal), int64 compared with
    float32 in float32, where over ints and of an int and a float16, and bitwise and/or/xor of bools and ints."""
    gen = torch.Generator().manual_seed(3)
    f = torch.cat([torch.tensor([0.0, -0.0, 0.5, -0.5, 1.7, -1.7, 2.5, -2.5, 126.9, -127.9, 99.99, -99.99]),
                   (torch.randn(20, generator=gen) * 40).clamp(-127, 127)])  # (beyond a type's range: undefined)
    i = torch.tensor([0, 1, -1, 127, 128, -129, 255, 256, 2049, 2051, 65519, 65520, -70000, 2**24 + 3, 2**31 - 1,
                      -2**31, 2**33 + 5, -2**40 - 1, 5, -6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], dtype=I64)
    m = torch.arange(32) % 3 == 0
    net = Network()
    fx, ix, mx = (net.add_input(name, t.dtype, t.shape) for name, t in (("f", f), ("i", i), ("m", m)))
    i32 = net.add_cast(ix, I32).get_output()
    for t, to in ((fx, I64), (fx, torch.int16), (fx, torch.int8), (i32, torch.int8), (ix, torch.uint8),
                  (ix, torch.int16), (ix, F16), (i32, F16), (mx, I32), (ix, torch.bool), (i32, F32)):
        net.mark_output(net.add_cast(t, to).get_output())
    net.mark_output(net.add_cast(net.add_cast(fx, F16).get_output(), I32).get_output())
    net.mark_output(net.add_elementwise(i32, ix, E.SUM).get_output())
    net.mark_output(net.add_elementwise(i32, net.add_constant(torch.tensor(2**32 + 7)).get_output(), E.PROD)
                    .get_output())
    net.mark_output(net.add_elementwise(i32, net.add_constant(torch.tensor(0.5)).get_output(), E.SUM).get_output())
    net.mark_output(net.add_elementwise(mx, i32, E.SUM).get_output())
    half = net.add_cast(fx, F16).get_output()
    net.mark_output(net.add_elementwise(i32, net.add_cast(i32, F16).get_output(), E.EQUAL).get_output())
    net.mark_output(net.add_elementwise(ix, fx, E.GREATER).get_output())
    net.mark_output(net.add_select(mx, i32, ix).get_output())
    net.mark_output(net.add_select(mx, i32, half).get_output())
    other = net.add_elementwise(fx, fx, E.LESS).get_output()
    net.mark_output(net.add_elementwise(mx, other, E.BITWISE_AND).get_output())
    net.mark_output(net.add_elementwise(mx, other, E.BITWISE_XOR).get_output())
    net.mark_output(net.add_elementwise(net.add_elementwise(i32, ix, E.BITWISE_OR).get_output(), ix, E.MIN)
                    .get_output())
    assert all(fusable(layer) is None for layer in net.layers if not isinstance(layer, L.ConstantLayer))
    _assert_exact(net, {"f": f, "i": i, "m": m})


def test_narrow_integers_wrap_at_their_width():
    """int8 and uint8 sums and products wrap at 8 bits, int16 at 16, as ATen's."""
    for dtype, values in ((torch.int8, [0, 1, -1, 100, -100, 127, -128]), (torch.uint8, [0, 1, 100, 200, 255]),
                          (torch.int16, [0, 1, -1, 300, -300, 32767, -32768])):
        a, b = torch.cartesian_prod(torch.tensor(values, dtype=dtype), torch.tensor(values, dtype=dtype)).unbind(1)
        net = Network()
        x, y = net.add_input("a", dtype, a.shape), net.add_input("b", dtype, b.shape)
        for op in (E.SUM, E.PROD, E.SUB, E.MAX):
            net.mark_output(net.add_elementwise(x, y, op).get_output())
        _assert_exact(net, {"a": a, "b": b})


def test_launcher_names_a_wrong_input():
    net = _epilogue(F32, (3, 1, 1))
    launcher = compile_group(net.layers, net.inputs, net.outputs)
    x, bias = torch.randn(2, 3, 4, 5, device=DEVICE), torch.randn(3, 1, 1, device=DEVICE)
    with pytest.raises(EngineInputError, match="takes 2 inputs"):
        launcher([x])
    with pytest.raises(EngineInputError, match="'bias': expected torch.float32"):
        launcher([x, bias.half()])
    with pytest.raises(EngineInputError, match="do not broadcast"):
        launcher([x, torch.randn(4, 1, 1, device=DEVICE)])


def test_kernels_index_in_int64_only_where_an_offset_needs_it():
    from torchkiln.runtime.backends.cuda.codegen import needs_int64

    meta = torch.device("meta")
    assert not needs_int64(torch.empty(4, 1024, device=meta), torch.empty(0, device=meta))
    assert needs_int64(torch.empty(1 << 31, device=meta, dtype=torch.int8))
    assert needs_int64(torch.empty_strided((2, 3), (1 << 31, 1), device=meta))  # the last row starts past 2**31
    assert not needs_int64(torch.empty(3, device=meta).expand(1 << 20, 3))  # broadcast: stride 0


# ---- the indexed generator (codegen/indexed.py): pointwise and movement layers, the moves as index arithmetic ----

def run_indexed(net: Network, values: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    from torchkiln.runtime.backends.cuda.codegen.indexed import compile_group as compile_indexed

    launcher = compile_indexed(net.layers, net.inputs, net.outputs)
    return launcher([values[t.name].to(DEVICE) for t in net.inputs])


def _slice_along(net: Network, t, dim: int, start: int, size: int, step: int = 1):
    starts, sizes = [0] * t.rank, list(t.shape)
    starts[dim], sizes[dim] = start, size
    steps = [1] * t.rank
    steps[dim] = step
    return net.add_slice(t, starts, sizes, steps).get_output()


def _roll(net: Network, t, shift: int, dim: int):
    """torch.roll as its converter writes it: two slices concatenated."""
    size = t.shape[dim]
    return net.add_concatenation([_slice_along(net, t, dim, size - shift, shift),
                                  _slice_along(net, t, dim, 0, size - shift)], dim).get_output()


@pytest.mark.parametrize("dtype", [F32, F16])
def test_a_shifted_window_partition_with_padding_and_a_weight_is_one_kernel(dtype):
    """roll by 3 along H and W, the 4x4 window partition (reshape, transpose, reshape), a constant pad and a
    broadcast weight: exactly the layers' values (movement only reads and writes)."""
    net = Network("windows")
    x = net.add_input("x", dtype, (2, 8, 8, 6))
    rolled = _roll(net, _roll(net, x, 3, 1), 3, 2)
    split = net.add_shuffle(rolled, reshape_dims=(2, 2, 4, 2, 4, 6)).get_output()
    windows = net.add_shuffle(split, first_transpose=(0, 1, 3, 2, 4, 5), reshape_dims=(8, 16, 6)).get_output()
    padded = net.add_padding(windows, (1, 2, 0, 0, 0, 1), L.PaddingMode.CONSTANT, 0.1).get_output()
    weight = net.add_constant(torch.randn(9).to(dtype)).get_output()
    net.mark_output(net.add_elementwise(padded, weight, E.PROD).get_output())
    values = {"x": torch.randn(2, 8, 8, 6).to(dtype)}
    (got,), (ref,) = run_indexed(net, values), reference(net, values)
    assert torch.equal(got.cpu(), ref.cpu())


@pytest.mark.parametrize("flags", [False, True], ids=["sum", "bool-concatenation"])
def test_reversed_and_strided_slices_expands_and_bool_concatenations(flags):
    net = Network("moves")
    x = net.add_input("x", F32, (3, 1, 10))
    flipped = _slice_along(net, x, 2, 9, 5, -2)  # x[..., 9:0:-2]
    wide = net.add_expand(flipped, (3, 4, 5)).get_output()
    y = net.add_input("y", F32, (4, 5))
    if not flags:
        net.mark_output(net.add_elementwise(wide, y, E.SUM).get_output())
    else:
        both = net.add_concatenation([
            net.add_elementwise(wide, y, E.GREATER).get_output(),
            net.add_expand(net.add_elementwise(y, y, E.EQUAL).get_output(), (3, 4, 5)).get_output()], axis=1)
        net.mark_output(net.add_padding(both.get_output(), (0, 0, 1, 0), L.PaddingMode.CONSTANT, 1.0).get_output())
    values = {"x": torch.tensor(SPECIAL[:10]).reshape(1, 1, 10).expand(3, 1, 10).clone(),
              "y": torch.randn(4, 5)}
    values["y"][0, 0] = float("nan")
    (got,), (ref,) = run_indexed(net, values), reference(net, values)
    assert_close(got, ref)


def test_outputs_of_two_shapes_and_a_wrong_input_shape_are_refused_by_name():
    from torchkiln.runtime.backends.cuda.codegen.indexed import compile_group as compile_indexed, generate as gen

    net = Network("two")
    x = net.add_input("x", F32, (2, 6))
    cat = net.add_concatenation([x, x], axis=1).get_output()
    with pytest.raises(NetworkError, match="different or dynamic shapes"):
        gen(net.layers, [x], [cat, net.add_unary(x, U.NEG).get_output()])
    launcher = compile_indexed([cat.producer], [x], [cat])
    with pytest.raises(EngineInputError, match=r"input 'x': expected torch.float32 \[2, 6\]"):
        launcher([torch.randn(2, 5, device=DEVICE)])


@pytest.mark.parametrize("asked", [False, True], ids=["inputs-channels-last", "asked-channels-last"])
def test_an_indexed_kernel_walks_channels_last_where_its_inputs_are_or_where_asked(asked):
    """A concatenation of channels-last tensors along the channels (a skip connection) is written channels-last, as
    ATen's keeps them, walking N, H, W, C; the values are the layers'."""
    from torchkiln.runtime.backends.cuda.codegen.indexed import compile_group as compile_indexed

    net = Network("skip")
    a, b = net.add_input("a", F16, (2, 3, 4, 5)), net.add_input("b", F16, (2, 6, 4, 5))
    net.mark_output(net.add_concatenation([a, net.add_activation(b, A.RELU).get_output()], 1).get_output())
    values = {"a": torch.randn(2, 3, 4, 5).half(), "b": torch.randn(2, 6, 4, 5).half()}
    if not asked:
        values = {k: v.contiguous(memory_format=torch.channels_last) for k, v in values.items()}
    launcher = compile_indexed(net.layers, net.inputs, net.outputs, channels_last=asked)
    (got,) = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    assert "i1 = rem % 9" in launcher.kernel.source  # the row-major kernel; the channels-last one walks C innermost
    assert torch.equal(got.cpu(), reference(net, values)[0])


def test_an_indexed_window_partition_of_a_channels_last_map_is_row_major():
    """A window partition ([B, C, H, W] split into windows, permuted and merged into [B, windows, tokens, C]) of a
    channels-last map is written row-major: its readers (a layer norm over C, a linear layer) read rows of C. Before,
    the kernel took the layout of its channels-last input, though the partition gives its dims other meanings, and
    ATen's linear then copied the rows and added its bias in two more kernels. The values are the layers'."""
    from torchkiln.runtime.backends.cuda.codegen.indexed import compile_group as compile_indexed

    b, c, h, w, p = 2, 8, 4, 6, 2
    net = Network("partition")
    x = net.add_input("x", F16, (b, c, h, w))
    split = net.add_shuffle(x, reshape_dims=(b, c, h // p, p, w // p, p)).get_output()
    windows = net.add_shuffle(split, first_transpose=(0, 2, 4, 3, 5, 1),
                              reshape_dims=(b, (h // p) * (w // p), p * p, c)).get_output()
    net.mark_output(windows)
    values = {"x": torch.randn(b, c, h, w).half().contiguous(memory_format=torch.channels_last)}
    launcher = compile_indexed(net.layers, net.inputs, net.outputs)
    (got,) = launcher([values["x"].to(DEVICE)])
    assert got.is_contiguous()
    assert torch.equal(got.cpu(), reference(net, values)[0])


def test_integer_rolls_and_pads_are_index_arithmetic():
    """An int64 roll (two slices concatenated), padded with a constant past int32 and added to an int32: the moves,
    the fill and the sum in one indexed kernel, exact."""
    ids = torch.tensor([[5, -3, 2**40, 7], [0, 1, -2**62, 9]])
    net = Network()
    x = net.add_input("ids", I64, ids.shape)
    rolled = _roll(net, x, 1, 1)
    padded = net.add_padding(rolled, [1, 2], L.PaddingMode.CONSTANT, float(2**33)).get_output()
    small = net.add_constant(torch.arange(14, dtype=I32).reshape(2, 7) - 5).get_output()
    net.mark_output(net.add_elementwise(padded, small, E.SUM).get_output())
    got, ref = run_indexed(net, {"ids": ids})[0], reference(net, {"ids": ids})[0]
    assert got.dtype == ref.dtype == I64 and torch.equal(got.cpu(), ref)


def test_a_negative_float_cast_to_uint8_wraps_as_atens_cast():
    """ATen converts a float to uint8 through int64 (c10's cast: -1.5 gives 255 on every device), where the GPU's own
    conversion clamps to 0; the generated kernels convert as ATen (on a GPU this fails without the int64 hop)."""
    f = torch.tensor([-1.5, -1.0, -100.7, -128.0, 0.2, 1.9, 127.5, 200.9, 255.0, -0.0])
    net = Network()
    fx = net.add_input("f", f.dtype, f.shape)
    net.mark_output(net.add_cast(fx, torch.uint8).get_output())
    net.mark_output(net.add_elementwise(net.add_cast(fx, torch.uint8).get_output(),
                                        net.add_constant(torch.tensor(3, dtype=torch.uint8)).get_output(),
                                        E.SUM).get_output())
    _assert_exact(net, {"f": f})
