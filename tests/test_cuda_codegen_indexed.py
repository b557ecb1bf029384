"""The indexed kernel generator (runtime/backends/cuda/codegen/indexed.py) in its 2-D form: an output whose innermost
walked dim has at least MIN_COLUMNS elements is computed in blocks of rows by that dim's columns, each row's index
arithmetic done once. Every movement the generator computes, moving the column dim or reading it masked, matches
eager exactly (Triton's interpreter on a machine without CUDA)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton", reason="triton is not installed")

import torchkiln  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen import indexed  # noqa: E402
from torchkiln.runtime.engine import Engine  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module", autouse=True)
def interpreter(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("torchkiln-cache")))
        yield


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _windows(x):  # [B, H, W, C] -> [B * windows, 7 * 7, C]: the column dim kept, the rows' dims re-split
    b, h, w, c = x.shape
    return x.view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 49, c) * 2.0


CASES = {
    "window partition": (_windows, [(2, 14, 14, 24)]),
    "transpose moving the columns": (lambda x: x.transpose(1, 2) + 1.0, [(2, 20, 18)]),
    "concatenation along the columns": (lambda a, b: torch.cat([a, b], -1) * 3.0, [(2, 3, 10), (2, 3, 9)]),
    "padding along the columns": (lambda x: F.pad(x, (3, 2), value=-1.5), [(2, 5, 17)]),
    "strided slice of the columns": (lambda x: x[..., 1::2] - 0.5, [(2, 4, 40)]),
    "max pool": (lambda x: F.max_pool2d(x, 3, 1, 1), [(1, 3, 20, 20)]),
    "bilinear resize": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), [(1, 2, 9, 9)]),
    "row value broadcast along the columns": (lambda x, r: x.transpose(1, 2) * r, [(2, 20, 3), (2, 3, 1)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_2d_block_matches_eager(name):
    fn, shapes = CASES[name]
    module = Fn(fn).eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input(s) for s in shapes],
                                              backend="reference")
    net = Engine.deserialize(data).network
    layers = [layer for layer in net.layers if not isinstance(layer, L.ConstantLayer)]
    constants = [layer.outputs[0] for layer in net.layers if isinstance(layer, L.ConstantLayer)]
    launcher = indexed.IndexedLauncher(layers, [*net.inputs, *constants], net.outputs)
    assert launcher.kernel.block[1] >= indexed.MIN_COLUMNS and launcher.kernel.column == len(net.outputs[0].shape) - 1
    xs = [torch.randn(s) for s in shapes]
    got = launcher([x.to(DEVICE) for x in xs] + [L.constant_value(t).to(DEVICE) for t in constants])[0]
    ref = module(*xs)
    assert got.shape == ref.shape and (got.cpu() - ref).abs().max().item() <= 1e-6 * ref.abs().max().item()


def test_a_short_innermost_dim_keeps_the_flat_block():
    """Under MIN_COLUMNS elements a 2-D block would idle most of its lanes: one flat block of elements instead."""
    net = Engine.deserialize(torchkiln.convert_method_to_engine(Fn(lambda x: x.transpose(1, 2) * 2.0).eval(),
                                                                "forward", [torchkiln.Input((2, 7, 20))],
                                                                backend="reference")).network
    layers = [layer for layer in net.layers if not isinstance(layer, L.ConstantLayer)]
    constants = [layer.outputs[0] for layer in net.layers if isinstance(layer, L.ConstantLayer)]
    kernel = indexed.generate(layers, [*net.inputs, *constants], net.outputs)
    assert kernel.block == (indexed.BLOCK, 0) and kernel.grid() == ((2 * 20 * 7 + indexed.BLOCK - 1) // indexed.BLOCK,)
