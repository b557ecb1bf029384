"""CUDA: engines built for and run on the GPU (skipped where there is none; run on the GPU machine)."""
import pytest
import torch
from harness import check_compiled

import torchkiln
from torchkiln.examples import MLP, SmallMobileNet, SmallResNet

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _true_fp32():
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # eager in true fp32, as the engine runs
        yield


@pytest.mark.parametrize("build, shape", [(SmallResNet, (2, 3, 64, 64)), (SmallMobileNet, (2, 3, 64, 64)),
                                          (MLP, (8, 64))], ids=["resnet", "mobilenet", "mlp"])
def test_model_on_cuda_matches_eager(build, shape):
    model = build().eval().cuda()
    check_compiled(model, [torch.randn(shape, device="cuda")])


def test_fp16_engine_on_cuda():
    model = SmallResNet().eval().cuda()
    x = torch.randn(2, 3, 64, 64, device="cuda")
    compiled = torchkiln.compile(model, [torchkiln.Input(x.shape)], enabled_precisions={torch.float16})
    out, ref = compiled(x), model(x).detach()
    assert out.dtype == torch.float32
    cosine = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
    assert cosine >= 0.999 and (out - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_cpu_input_to_a_cuda_engine_is_named():
    compiled = torchkiln.compile(MLP().eval().cuda(), [torchkiln.Input((2, 64))])
    with pytest.raises(RuntimeError, match=r"engine input 0 \('x'\): expected a tensor on cuda, got one on cpu"):
        compiled(torch.randn(2, 64))


def test_save_and_load_on_cuda(tmp_path):
    model = SmallResNet().eval().cuda()
    x = torch.randn(1, 3, 32, 32, device="cuda")
    torch.jit.save(torchkiln.compile(model, [torchkiln.Input(x.shape)]), tmp_path / "m.ts")
    loaded = torch.jit.load(tmp_path / "m.ts")
    err = (loaded(x) - model(x)).abs().max().item()
    assert err <= 1e-4 * model(x).abs().max().item()


def test_module_and_device_mismatch_is_named():
    with pytest.raises(ValueError, match="device: the module's weights are on cpu"):
        torchkiln.compile(MLP().eval(), [torchkiln.Input((2, 64))], device="cuda")
