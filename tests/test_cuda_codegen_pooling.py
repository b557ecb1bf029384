"""The generated 2-D max pool kernel (runtime/backends/cuda/codegen/pooling.py) against
torch.nn.functional.max_pool2d, exactly (a max is exact): float32, float16 and bfloat16, channels-last and
contiguous inputs, padding, stride, dilation, ceil mode, NaN and -inf. On a machine without CUDA the kernel runs
in Triton's CPU interpreter."""
import itertools

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import EngineInputError, NetworkError  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.pooling import MaxPool2d, output_size, poolable  # noqa: E402

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy on NaN and inf in the interpreter
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def pool_layer(dtype, shape, window, stride=(), padding=(0,), dilation=(), ceil_mode=False) -> L.PoolingLayer:
    net = Network()
    x = net.add_input("x", dtype, shape)
    return net.add_pooling_nd(x, L.PoolingType.MAX, window, stride=stride, padding=padding, dilation=dilation,
                              ceil_mode=ceil_mode)


def check(x: torch.Tensor, window, stride=(), padding=(0,), dilation=(), ceil_mode=False) -> torch.Tensor:
    """Pool `x` through the kernel; assert it is max_pool2d's result, bit for bit, in x's memory format."""
    layer = pool_layer(x.dtype, tuple(x.shape), window, stride, padding, dilation, ceil_mode)
    got = MaxPool2d(layer)(x.to(DEVICE)).cpu()
    ref = F.max_pool2d(x.float(), window, stride or None, padding, dilation or 1, ceil_mode).to(x.dtype)
    assert got.shape == ref.shape
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(got.nan_to_num(0.0), ref.nan_to_num(0.0)), (got - ref).abs().max()
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return got


def data(shape, dtype, channels_last, seed=0) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


CASES = {  # (shape, window, stride, padding, dilation, ceil_mode)
    "3x3_s2_p1": ((2, 5, 9, 8), (3, 3), (2, 2), (1, 1), (), False),
    "2x2_s2": ((2, 6, 8, 6), (2, 2), (2, 2), (0,), (), False),
    "ceil_odd": ((1, 3, 7, 9), (3, 3), (2, 2), (0,), (), True),
    "ceil_pad_last_window_dropped": ((1, 3, 5, 6), (2, 2), (2, 2), (1,), (), True),
    "dilation_2": ((2, 4, 9, 10), (3, 2), (1, 2), (1, 1), (2, 2), False),
    "dilation_2_ceil": ((1, 3, 8, 9), (3, 3), (2, 2), (1, 1), (2, 2), True),
    "no_stride_is_the_window": ((1, 3, 6, 7), (2, 3), (), (0,), (), True),
}


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_max_pool2d_exactly(case, channels_last, dtype):
    shape, window, stride, padding, dilation, ceil_mode = CASES[case]
    check(data(shape, dtype, channels_last), window, stride, padding, dilation, ceil_mode)


def test_more_channels_than_one_block():
    """C = 130: three channel blocks of 128 (the last nearly empty); channels-last."""
    check(data((1, 130, 5, 5), F16, True), (3, 3), (2, 2), (1, 1))


@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_nan_propagates_and_minus_inf_is_a_value(dtype, channels_last):
    x = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(3)).to(dtype)
    x[0, 0, 0, 0] = float("nan")  # in the top-left windows (also in padding's reach)
    x[0, 1, 3, 3] = float("nan")
    x[0, 2] = float("-inf")  # a whole channel of -inf: its max is -inf
    x[0, 3, :2, :2] = float("-inf")
    x[0, 3, 4, 4] = float("inf")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    got = check(x, (3, 3), (2, 2), (1, 1))
    assert got[0, 0, 0, 0].isnan() and got[0, 2].eq(float("-inf")).all() and got[0, 3].eq(float("inf")).any()


def test_a_non_dense_view_and_an_empty_batch():
    x = torch.randn(2, 3, 8, 12, generator=torch.Generator().manual_seed(4))[..., ::2]
    check(x, (2, 2), (2, 2))
    check(torch.randn(0, 3, 8, 8), (2, 2), (2, 2))


def test_output_size_is_torchs():
    for size, window, stride, dilation, ceil_mode in itertools.product((1, 2, 5, 6, 7, 8), (1, 2, 3), (1, 2, 3),
                                                                        (1, 2), (False, True)):
        for pad in range(window // 2 + 1):
            try:
                ref = F.max_pool2d(torch.zeros(1, 1, size, 1), (window, 1), (stride, 1), (pad, 0), (dilation, 1),
                                   ceil_mode).shape[2]
            except RuntimeError:  # torch: the output is too small
                ref = None
            got = output_size(size, window, stride, pad, dilation, ceil_mode)
            assert got == ref or (ref is None and got < 1), (size, window, stride, pad, dilation, ceil_mode)


def test_what_the_kernel_refuses():
    assert poolable(pool_layer(F32, (1, 2, 4, 4), (2, 2), (2, 2))) is None
    net = Network()
    x = net.add_input("x", F32, (1, 2, 4, 4))
    assert "max pooling" in poolable(net.add_pooling_nd(x, L.PoolingType.AVERAGE, (2, 2), stride=(2, 2),
                                                        padding=(0,)))
    assert "2-d" in poolable(pool_layer(F32, (2, 4, 4), (2, 2), (2, 2)))
    assert "int32" in poolable(pool_layer(torch.int32, (1, 2, 4, 4), (2, 2), (2, 2)))
    with pytest.raises(NetworkError, match="not a 2-d max pool"):
        MaxPool2d(pool_layer(F32, (2, 4, 4), (2, 2), (2, 2)))
    launch = MaxPool2d(pool_layer(F32, (1, 2, 4, 4), (3, 3), (1, 1)))
    with pytest.raises(EngineInputError, match="too small"):
        launch(torch.randn(1, 2, 2, 2, device=DEVICE))
    with pytest.raises(EngineInputError, match="4-d float"):
        launch(torch.randn(2, 4, 4, device=DEVICE))
