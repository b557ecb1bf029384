"""The reference executor: the kernels it runs in place of a layer's reference meaning."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchkiln.ir import Network
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.ir.reference import MEANINGS


class _RecordOps(TorchDispatchMode):
    """Records each ATen call (op and arguments) made while it is active."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func.overloadpacket), args))
        return func(*args, **(kwargs or {}))


def _conv_network(shape, kernel, bias, **params):
    n = Network()
    x = n.add_input("x", torch.float32, shape)
    layer = n.add_convolution_nd(x, kernel, bias, **params)
    n.mark_output(layer.get_output())
    return n, layer


@pytest.mark.parametrize("shape, kernel, params", [
    ((2, 4, 9), (6, 2, 3), dict(stride=(2,), padding=(1,), dilation=(2,), groups=2)),
    ((1, 3, 8, 8), (5, 3, 3, 3), dict(stride=(1, 2), padding=(1, 0), dilation=(1, 1))),
    ((1, 4, 5, 5), (4, 3, 2, 2), dict(stride=(2, 2), padding=(0, 1), dilation=(1, 1), transposed=True,
                                      output_padding=(1, 0))),
    ((1, 2, 4, 4, 4), (3, 2, 2, 2, 2), dict(stride=(1, 1, 1), padding=(0, 0, 0), dilation=(1, 1, 1))),
], ids=["1d-groups", "2d", "2d-transposed", "3d"])
def test_convolution_refuses_tf32_per_call_and_computes_the_reference_meaning(shape, kernel, params):
    """The executor's convolution passes allow_tf32=False to aten::_convolution (cuDNN's TF32 flag is
    process-wide, so the engine never sets it) and computes exactly what the reference meaning does."""
    channels = kernel[1] if params.get("transposed") else kernel[0]
    n, layer = _conv_network(shape, torch.randn(kernel), torch.randn(channels), **params)
    engine = Engine(n, [InputBinding("x", torch.float32, shape, shape, shape)], "cpu", torch.float32)
    x = torch.randn(shape)
    before = torch.backends.cudnn.allow_tf32
    with _RecordOps() as ops:
        (out,) = engine.execute([x])
    assert torch.backends.cudnn.allow_tf32 == before
    convolutions = [args for op, args in ops.calls if op == "aten._convolution"]
    assert len(convolutions) == 1 and convolutions[0][-1] is False  # allow_tf32
    assert not any(op == "aten.convolution" for op, _ in ops.calls)
    expected = MEANINGS[type(layer)](layer, [x], layer.weights, torch.device("cpu"))
    assert torch.equal(out, expected)
