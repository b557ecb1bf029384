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


def test_a_module_without_weights_runs_where_its_example_inputs_are():
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sigmoid()).eval()
    x = torch.randn(8, 16, device="cuda")
    compiled = torchkiln.compile(model, [x], min_block_size=1)
    out = compiled(x)
    ref = model(x)
    assert out.device == x.device and (out - ref).abs().max() <= 1e-4 * ref.abs().max()


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


def test_fp32_convolution_is_true_fp32_and_no_global_flag_changes():
    """cuDNN's TF32 stays allowed for the user (torch's default) while the engine's convolution refuses it
    for its own calls; TF32 would miss the fp64 result by ~1e-3 relative over 1152-term sums."""
    model = torch.nn.Conv2d(128, 64, 3, padding=1).eval().cuda()
    x = torch.randn(2, 128, 32, 32, device="cuda")
    compiled = torchkiln.compile(model, [torchkiln.Input(x.shape)], min_block_size=1)  # one op: one engine
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        out = compiled(x)
        assert torch.backends.cudnn.allow_tf32 is True
        tf32 = model(x).detach()
    exact = torch.nn.functional.conv2d(x.double(), model.weight.double(), model.bias.double(), padding=1)
    scale = exact.abs().max().item()
    assert (out.double() - exact).abs().max().item() <= 1e-5 * scale
    if torch.cuda.get_device_capability() >= (8, 0):  # the check can fail: eager with TF32 misses the bound
        assert (tf32.double() - exact).abs().max().item() > 1e-5 * scale
