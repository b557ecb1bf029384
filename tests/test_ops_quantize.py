"""Fake quantization through the whole pipeline, compared with eager bit for bit (exact equality)."""
import pytest
import torch
from harness import assert_falls_back, check_compiled, check_traced


def _inputs(scale: float) -> torch.Tensor:
    """Random values, exact half steps (round half to even), far out of range, and inf/nan."""
    x = torch.cat([torch.randn(200) * 40 * scale, (torch.arange(-20, 20) + 0.5) * scale,
                   torch.tensor([1e30, -1e30, float("inf"), -float("inf"), float("nan")])])
    return x.reshape(5, -1)


@pytest.mark.parametrize("scale,zero_point,lo,hi", [(0.1, 3, 0, 255), (0.0137, 0, -128, 127), (1 / 3, -5, -128, 127),
                                                     (2.0, 0, 0, 15)])
def test_fake_quantize_per_tensor(scale, zero_point, lo, hi):
    fn = lambda x: torch.fake_quantize_per_tensor_affine(x, scale, zero_point, lo, hi)  # noqa: E731
    check_traced(fn, _inputs(scale), op="aten::fake_quantize_per_tensor_affine", rtol=0)


def test_fake_quantize_per_tensor_tensor_qparams():
    scale, zero_point = torch.tensor([0.05]), torch.tensor([2], dtype=torch.int32)
    fn = lambda x: torch.fake_quantize_per_tensor_affine(x, scale, zero_point, -128, 127)  # noqa: E731
    check_traced(fn, _inputs(0.05), op="aten::fake_quantize_per_tensor_affine.tensor_qparams", rtol=0)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_fake_quantize_per_channel(axis):
    x = torch.randn(4, 3, 5) * 10
    x[0, 0, 0] = float("nan")
    channels = x.shape[axis]
    scale = torch.rand(channels) * 0.2 + 0.01
    zero_point = torch.randint(-3, 4, (channels,), dtype=torch.int32)
    fn = lambda t: torch.fake_quantize_per_channel_affine(t, scale, zero_point, axis, -128, 127)  # noqa: E731
    check_traced(fn, x, op="aten::fake_quantize_per_channel_affine", rtol=0)


class PerChannel(torch.nn.Module):
    """Per-channel fake quantization with the given zero points, as a quantization-aware model holds them."""

    def __init__(self, zero_point: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.1, 0.2, 0.05]))
        self.register_buffer("zero_point", zero_point)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fake_quantize_per_channel_affine(x, self.scale, self.zero_point, 1, 0, 255)


def test_fake_quantize_scripted_per_channel():
    check_compiled(PerChannel(torch.tensor([0, 10, 128], dtype=torch.int32)), [torch.randn(2, 3, 4) * 5],
                   min_block_size=1, rtol=0)


def test_float_zero_point_falls_back():
    _, report = check_compiled(PerChannel(torch.tensor([0.5, 10.2, 128.0])), [torch.randn(2, 3, 4) * 5],
                               min_block_size=1, engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::fake_quantize_per_channel_affine", "floating-point zero_point")


def test_fake_quantize_of_half_falls_back():
    fn = lambda t: torch.fake_quantize_per_tensor_affine(t, 0.1, 0, -128, 127)  # noqa: E731
    _, report = check_traced(fn, torch.randn(2, 3).half(), engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::fake_quantize_per_tensor_affine", "float16")
