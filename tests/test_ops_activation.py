"""Activations through the whole pipeline against eager: every activation with default and explicit
parameters, special values, integer inputs where eager takes them, non-contiguous inputs, modules
with inplace=True, and the arguments that stay in PyTorch."""
import pytest
import torch
import torch.nn.functional as F
from harness import check_compiled, check_fn, check_traced

ids = lambda v: getattr(v, "__name__", str(v))  # noqa: E731


def relu(x):
    return torch.relu(x)


def sigmoid(x):
    return torch.sigmoid(x)


def tanh(x):
    return torch.tanh(x)


def selu(x):
    return F.selu(x)


def silu(x):
    return F.silu(x)


def mish(x):
    return F.mish(x)


def hardsigmoid(x):
    return F.hardsigmoid(x)


def hardswish(x):
    return F.hardswish(x)


def logsigmoid(x):
    return F.logsigmoid(x)


def leaky_relu(x):
    return F.leaky_relu(x)


def leaky_relu_02(x):
    return F.leaky_relu(x, 0.2)


def elu(x):
    return F.elu(x)


def elu_07(x):
    return F.elu(x, 0.7)


def celu_05(x):
    return F.celu(x, 0.5)


def gelu(x):
    return F.gelu(x)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def hardtanh(x):
    return F.hardtanh(x)


def hardtanh_2(x):
    return F.hardtanh(x, -2.0, 2.0)


def relu6(x):
    return F.relu6(x)


def threshold(x):
    return F.threshold(x, 0.1, 2.0)


def softplus(x):
    return F.softplus(x)


def softplus_beta_threshold(x):
    return F.softplus(x, 2.0, 1.0)


def hardshrink(x):
    return F.hardshrink(x)


def hardshrink_12(x):
    return F.hardshrink(x, 1.2)


def softsign(x):
    return F.softsign(x)


ACTIVATIONS = [relu, sigmoid, tanh, selu, silu, mish, hardsigmoid, hardswish, logsigmoid, leaky_relu, leaky_relu_02,
               elu, elu_07, celu_05, gelu, gelu_tanh, hardtanh, hardtanh_2, relu6, threshold, softplus,
               softplus_beta_threshold, hardshrink, hardshrink_12, softsign]


@pytest.mark.parametrize("fn", ACTIVATIONS, ids=ids)
@pytest.mark.parametrize("values", ["wide", "negative"])
def test_activation_float32(fn, values):
    """Wide inputs cover every regime; negative ones give small outputs, so that the tolerance (relative to
    the largest output) tells close variants apart, like gelu's erf and tanh forms."""
    x = torch.randn(2, 3, 8) * 4 if values == "wide" else -torch.rand(2, 3, 8) * 3 - 0.5
    check_fn(fn, x)


SPECIAL = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 0.5, -0.5, 1.2, -1.2, 6.0, 30.0])


@pytest.mark.parametrize("fn", ACTIVATIONS, ids=ids)
def test_activation_special_values(fn):
    """Infinities, NaN, zeros and the points where each activation changes form; for the erf GELU not +inf:
    eager's GELU(+inf) is +inf or NaN by the CPU's vector path and the element's place in its vectorized loop (torch
    2.13 on AVX-512 gives NaN), so it is no reference there."""
    check_fn(fn, SPECIAL[SPECIAL != float("inf")] if fn is gelu else SPECIAL)


@pytest.mark.parametrize("fn", [relu, relu6, hardtanh, threshold, sigmoid, tanh], ids=ids)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_activation_integer_input(fn, dtype):
    check_fn(fn, torch.randint(-8, 9, (3, 4), dtype=dtype))


def test_activation_int64_truncated():
    check_fn(relu6, torch.randint(-8, 9, (3, 4)), truncate_long_and_double=True)


@pytest.mark.parametrize("fn", [gelu, silu, hardswish], ids=ids)
def test_activation_non_contiguous_input(fn):
    check_fn(fn, torch.randn(5, 3).t())


@pytest.mark.parametrize("channels", [1, 4])
def test_prelu_module(channels):
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.PReLU(channels))
    with torch.no_grad():
        model[1].weight.uniform_(-0.5, 0.5)
    check_compiled(model, [torch.randn(2, 4, 3, 3)], min_block_size=1)


def prelu_shared_0d(x):
    return F.prelu(x * 2, torch.tensor([0.25]))


@pytest.mark.parametrize("x", [torch.tensor(-3.0), torch.randn(2, 3, 4)], ids=["0d", "3d"])
def test_prelu_with_one_shared_slope_keeps_the_input_shape(x):
    check_fn(prelu_shared_0d, x)


def test_inplace_modules_convert():
    """nn modules with inplace=True act on intermediates; lowering makes them functional."""
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 8), torch.nn.Hardswish(inplace=True),
        torch.nn.Linear(8, 8), torch.nn.LeakyReLU(0.1, inplace=True), torch.nn.Linear(8, 8),
        torch.nn.ReLU6(inplace=True), torch.nn.Linear(8, 8), torch.nn.SiLU(inplace=True), torch.nn.Linear(8, 8),
        torch.nn.Hardtanh(-0.5, 0.5, inplace=True), torch.nn.Linear(8, 8), torch.nn.ELU(inplace=True),
    )
    check_compiled(model, [torch.randn(4, 8)], min_block_size=1)


def elu_scaled(x):
    return torch.ops.aten.elu(x, 1.0, 2.0, 1.0)


def prelu_runtime_weight(x, w):
    return F.prelu(x, w)


@pytest.mark.parametrize("fn, example, reason", [
    (elu_scaled, [torch.randn(3, 4)], "elu with scale=2.0"),
    (prelu_runtime_weight, [torch.randn(2, 3, 4), torch.rand(3)], "constant weight"),
], ids=["elu-scale", "prelu-runtime-weight"])
def test_activation_stays_in_pytorch(fn, example, reason):
    """Arguments the converters cannot express leave the node in PyTorch, and say why."""
    _, report = check_fn(fn, *example, engines=0, torch_blocks=1)
    assert reason in report.blocks[0].fallback[0].detail


def test_silu_of_negative_inputs_keeps_its_relative_precision():
    """ONNX Runtime's Sigmoid loses relative precision below -8: x * Sigmoid(x) was off by 1.5e-4 x max|eager| for
    inputs all in [-20, -8] (OpInfo nn.functional.silu); x / (1 + exp(-x)) is not."""
    check_traced(silu, torch.linspace(-20, -8, 100))


class _ConvSiluTokens(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.linear = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.silu(self.conv(x))
        return y, F.silu(self.linear(y.flatten(2).transpose(1, 2)))


def test_silu_of_dynamic_shapes_matches_eager_and_hands_tiny_outputs_to_its_guard():
    """SiLUs of an image and of tokens whose batch and sizes are dynamic (the floor guard samples them by a Slice, not
    the static max pooling) match eager at several shapes, and so do SiLU outputs all tiny (the guard's calls)."""
    import torchkiln

    torch.manual_seed(0)
    spec = torchkiln.Input(min_shape=(1, 3, 4, 4), opt_shape=(2, 3, 8, 8), max_shape=(4, 3, 16, 16))
    for low in (False, True):  # with the convolution's outputs all near -30: SiLU outputs of ~1e-12
        model = _ConvSiluTokens().eval()
        if low:
            with torch.no_grad():
                model.conv.bias.fill_(-30.0)
        compiled, _ = check_compiled(model, [3 * torch.randn(2, 3, 8, 8)], inputs=[spec])
        for x in (3 * torch.randn(1, 3, 4, 4), 3 * torch.randn(4, 3, 10, 16)):
            with torch.no_grad():
                for out, ref in zip(compiled(x), model(x)):
                    assert (out - ref).abs().max() <= 1e-4 * ref.abs().max(), (low, x.shape)


_EDGES = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.5, -0.5, 0.25, 1.0, 0.999])


@pytest.mark.parametrize("name, fn", [
    ("softshrink", lambda x: torch.nn.functional.softshrink(x, 0.5)),
    ("glu", lambda x: torch.nn.functional.glu(x, 0)),
    ("logit", torch.logit),
    ("logit_eps", lambda x: torch.logit(x, 0.1)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_composed_activations(name, fn):
    check_traced(fn, torch.cat([torch.rand(6) * 1.2 - 0.1, _EDGES]).reshape(8, 2))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_polygamma(n):
    check_traced(lambda x: torch.polygamma(n, x), torch.cat([torch.rand(6) * 4 + 0.1, _EDGES]).reshape(8, 2))


@pytest.mark.parametrize("p", [1, 3])
def test_mvlgamma(p):
    x = torch.rand(4, 5) * 3 + (p - 1) / 2 + 0.01
    x[0, :2] = torch.tensor([float("nan"), float("inf")])
    check_traced(lambda x: torch.mvlgamma(x, p), x)
    check_traced(lambda x: torch.mvlgamma(x, p), torch.linspace(-2, 1, 20).reshape(4, 5))  # outside its domain too


def test_rrelu_in_inference_is_leaky_relu_with_the_mean_slope():
    check_traced(lambda x: F.rrelu(x, 0.1, 0.3, training=False), torch.cat([torch.randn(6), _EDGES]).reshape(8, 2))
