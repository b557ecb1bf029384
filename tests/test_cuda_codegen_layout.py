"""The generated channels-last copy (runtime/backends/cuda/codegen/layout.py) against ATen's, bit for bit: the
layouts a CUDA plan converts (a network input for a channels-last convolution, a generated step's NCHW output), a
slice of channels, few and many channels, odd sizes, and the cases that take ATen's copy. On a machine without
CUDA the kernel runs in Triton's CPU interpreter."""
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.runtime.backends.cuda.codegen.layout import (MIN_BYTES, copy_to_channels_last,  # noqa: E402
                                                            takes_generated_copy)
from torchkiln.runtime.backends.cuda.kernels import channels_last_input  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def values(shape, dtype) -> torch.Tensor:
    x = torch.randn(shape) * 100
    return (x.to(dtype) if dtype.is_floating_point else x.round().to(dtype)).to(DEVICE)


@pytest.mark.parametrize("shape, dtype", [((2, 3, 240, 240), torch.float32), ((4, 192, 28, 28), torch.float16),
                                          ((2, 5, 257, 129), torch.float32), ((2, 130, 45, 47), torch.bfloat16),
                                          ((3, 70, 37, 41), torch.int32)])
def test_copy_matches_aten_bit_for_bit(shape, dtype):
    x = values(shape, dtype)
    assert takes_generated_copy(x)
    got = copy_to_channels_last(x)
    assert got.is_contiguous(memory_format=torch.channels_last) and got.shape == x.shape
    assert torch.equal(got, x)


def test_copy_of_a_slice_of_channels_into_a_given_buffer():
    x = values((2, 6, 300, 300), torch.float32)[:, 1:4]
    out = torch.full(x.shape, float("nan"), device=DEVICE).contiguous(memory_format=torch.channels_last)
    assert takes_generated_copy(x) and copy_to_channels_last(x, out) is out
    assert torch.equal(out, x)


def test_cases_the_kernel_does_not_take_use_atens_copy():
    small = values((1, 3, 16, 16), torch.float32)
    assert small.numel() * 4 < MIN_BYTES and not takes_generated_copy(small)
    assert torch.equal(copy_to_channels_last(small), small)
    strided = values((2, 8, 200, 400), torch.float16)[..., ::2]  # positions not one run: ATen's copy
    assert not takes_generated_copy(strided)
    got = copy_to_channels_last(strided)
    assert got.is_contiguous(memory_format=torch.channels_last) and torch.equal(got, strided)


def test_a_channels_last_convolution_input_is_converted_once_and_kept_when_it_already_is():
    x = values((2, 64, 64, 64), torch.float32)
    converted = channels_last_input(x)
    assert converted.is_contiguous(memory_format=torch.channels_last) and torch.equal(converted, x)
    assert channels_last_input(converted) is converted
