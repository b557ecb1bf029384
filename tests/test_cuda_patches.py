"""The patch GEMM of a convolution whose windows tile its input (runtime/backends/cuda/patches.py), against
torch's convolution on the CPU, and as a planned step of the CUDA backend."""
import pytest
import torch
import torch.nn.functional as F

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends.cuda import planner
from torchkiln.runtime.backends.cuda.patches import patch_convolution, patch_gemm
from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.plan import Kernel, Plan, Step

CPU = torch.device("cpu")


@pytest.mark.parametrize("size", [(32, 32), (35, 43)], ids=["tiled", "remainder"])
@pytest.mark.parametrize("bias", [True, False])
def test_patch_gemm_is_the_convolution(size, bias):
    """ViT's patch embedding, small: 8x8 windows at stride 8; rows and columns past the last window are not read."""
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    w = torch.randn(12, 3, 8, 8, dtype=torch.float64)
    b = torch.randn(12, dtype=torch.float64) if bias else None
    got = patch_gemm(x, w, b)
    ref = F.conv2d(x, w, b, stride=8)
    assert got.shape == ref.shape == (2, 12, size[0] // 8, size[1] // 8)
    assert (got - ref).abs().max() <= 1e-12 * ref.abs().max()
    assert got.is_contiguous(memory_format=torch.channels_last)


def conv_layer(stride, padding=(0, 0), window=(4, 4), groups=1):
    x = Network("n").add_input("x", torch.float16, (1, 4, 8, 8))
    kernel = torch.randn(4, 4 // groups, *window)
    return L.ConvolutionLayer(name="c", inputs=[x], outputs=[x], weights={"kernel": kernel},
                              stride=stride, padding=padding, dilation=(1, 1), groups=groups)


def test_which_convolutions_are_patch_convolutions():
    assert patch_convolution(conv_layer((4, 4)))
    assert not patch_convolution(conv_layer((2, 2)))  # overlapping windows
    assert not patch_convolution(conv_layer((4, 4), padding=(1, 1)))
    assert not patch_convolution(conv_layer((4, 4), groups=2))
    assert not patch_convolution(conv_layer((1, 1), window=(1, 1)))  # a 1x1 convolution is a GEMM already


def test_patch_conv_step_matches_the_reference():
    """The step's maker in fp32 on the CPU (the planner picks it only in half precision, by timing on a GPU)."""
    net = Network("patches")
    x = net.add_input("x", torch.float32, (2, 3, 20, 20))
    y = net.add_convolution_nd(x, torch.randn(16, 3, 5, 5), torch.randn(16), stride=(5, 5), padding=(0, 0),
                               dilation=(1, 1)).get_output()
    net.mark_output(net.add_activation(y, L.ActivationType.RELU).get_output())
    plan = Plan(planner.target(CPU), [Kernel("library", "patch_conv"), Kernel("aten", "activation")],
                [Step(0, (0,)), Step(1, (1,))])
    bound = bind_steps(net, plan, place_weights(net, plan, CPU), None, [(2, 3, 20, 20)], CPU, allow_tf32=False)
    xv = torch.randn(2, 3, 20, 20)
    got = bound.run_eagerly([xv])[0]
    ref = ReferenceExecutor(net, CPU).run([xv])[0]
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_patch_embedding_engine_on_the_gpu():
    """A ViT patch embedding (16x16/16) then flatten and transpose, fp16 on the GPU, whichever way timing chose."""
    import torchkiln

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Conv2d(3, 64, 16, 16)

        def forward(self, x):
            return self.proj(x).flatten(2).transpose(1, 2)

    model = Embed().eval().cuda()
    x = torch.randn(4, 3, 64, 64, device="cuda")
    compiled = torchkiln.compile(model, [torchkiln.Input(x.shape)], enabled_precisions={torch.float16})
    with torch.no_grad():
        ref = model(x)
    got = compiled(x).float()  # fp32 in and out, fp16 inside
    assert F.cosine_similarity(got.flatten().double(), ref.flatten().double(), dim=0) >= 0.999
    assert (got - ref).abs().max() <= 1e-2 * ref.abs().max()
    xh = x.half()
    w, b = model.proj.weight.half(), model.proj.bias.half()
    direct = patch_gemm(xh, w, b).float()
    assert (direct - F.conv2d(xh.float(), w.float(), b.float(), stride=16)).abs().max() <= 2e-3 * ref.abs().max()
