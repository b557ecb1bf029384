"""Normalization converters through the whole pipeline: layer, group, instance and batch norm."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import assert_falls_back, check_compiled, check_fn, check_traced


def _randomize(module: nn.Module) -> nn.Module:
    """Non-trivial affine weights and running statistics, so that a dropped weight shows."""
    with torch.no_grad():
        for name, t in module.named_parameters():
            t.copy_(torch.randn_like(t))
        for name, t in module.named_buffers():
            if name.endswith("running_mean"):
                t.copy_(torch.randn_like(t))
            elif name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
    return module


@pytest.mark.parametrize("shape,normalized", [((2, 5, 8), [8]), ((2, 3, 4, 5), [4, 5]), ((6,), [6])])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, normalized, affine):
    ln = _randomize(nn.LayerNorm(normalized, elementwise_affine=affine, eps=1e-3))
    _, report = check_compiled(ln, [torch.randn(*shape) * 3 + 1], min_block_size=1)
    assert report.blocks[0].ops == ("aten::layer_norm",)


def test_layer_norm_without_bias():
    check_traced(_randomize(nn.LayerNorm(6, bias=False)), torch.randn(2, 6), op="aten::layer_norm")


def test_layer_norm_non_contiguous_input():
    weight = torch.randn(6)
    check_traced(lambda x: F.layer_norm(x.transpose(1, 2), [6], weight), torch.randn(2, 6, 4), op="aten::layer_norm")


@pytest.mark.parametrize("groups,channels,shape", [(2, 4, (2, 4, 5, 3)), (1, 3, (2, 3, 7)), (3, 3, (1, 3, 4, 4)),
                                                   (2, 6, (2, 6))])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(groups, channels, shape, affine):
    gn = _randomize(nn.GroupNorm(groups, channels, affine=affine))
    check_traced(gn, torch.randn(*shape) * 2 - 1, op="aten::group_norm")


def group_norm_scripted(x):
    return torch.group_norm(x, 2, None, None, 1e-4)


def test_group_norm_scripted():
    check_fn(group_norm_scripted, torch.randn(2, 4, 3, 3), op="aten::group_norm")


@pytest.mark.parametrize("cls,shape", [(nn.InstanceNorm1d, (2, 3, 9)), (nn.InstanceNorm2d, (2, 3, 5, 4)),
                                       (nn.InstanceNorm3d, (1, 3, 3, 4, 2))])
@pytest.mark.parametrize("affine,track", [(False, False), (True, False), (True, True), (False, True)])
def test_instance_norm(cls, shape, affine, track):
    norm = _randomize(cls(3, affine=affine, track_running_stats=track)).eval()
    check_traced(norm, torch.randn(*shape) * 2 + 0.5, op="aten::instance_norm")


def instance_norm_running_stats_updated(x):
    return torch.instance_norm(x, None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5, False)


def test_instance_norm_updating_running_stats_falls_back():
    _, report = check_fn(instance_norm_running_stats_updated, torch.randn(2, 3, 4), engines=None,
                            torch_blocks=1)
    assert_falls_back(report, "aten::instance_norm", "updates its running statistics")


def batch_norm_training(x):
    return F.batch_norm(x, torch.zeros(3), torch.ones(3), training=True)


def batch_norm_inference(x):
    return F.batch_norm(x, torch.zeros(3) + 0.5, torch.ones(3) * 2, training=False, eps=1e-3)


def test_batch_norm_with_batch_statistics_falls_back():
    _, report = check_fn(batch_norm_training, torch.randn(4, 3, 5), engines=None, torch_blocks=1)
    assert_falls_back(report, "aten::batch_norm", "training=True")


def test_batch_norm_inference_functional():
    check_fn(batch_norm_inference, torch.randn(4, 3, 5), op="aten::batch_norm")


@pytest.mark.parametrize("cls,shape", [(nn.BatchNorm1d, (4, 3)), (nn.BatchNorm1d, (4, 3, 5)),
                                       (nn.BatchNorm3d, (2, 3, 2, 3, 2))])
def test_batch_norm_modules(cls, shape):
    check_traced(_randomize(cls(3)).eval(), torch.randn(*shape), op="aten::batch_norm")


@pytest.mark.parametrize("op,fn", [("aten::layer_norm", lambda t: F.layer_norm(t, [5], eps=-0.5)),
                                   ("aten::group_norm", lambda t: F.group_norm(t, 1, eps=-0.5))])
def test_negative_eps_stays_in_pytorch_with_its_reason(op, fn):
    """torch takes eps < 0 (NaN where var + eps < 0; OpInfo layer_norm); the layer does not: refused up front."""
    _, report = check_traced(fn, torch.randn(3, 4, 5), engines=None, torch_blocks=1)
    assert_falls_back(report, op, "eps=-0.5 is negative")


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm(eps):
    x = torch.randn(2, 5, 6)
    x[0, 0, 0], x[1, 1, 1] = float("nan"), float("inf")
    check_traced(lambda x: F.rms_norm(x, [6], eps=eps), x)
    check_traced(lambda x, w: F.rms_norm(x, [5, 6], w, eps=eps), x, torch.randn(5, 6))
