"""Bad settings get a ValueError that names the argument, before any work is done; setting aliases."""
from typing import Tuple

import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.examples import MLP

SPEC = [torchkiln.Input((2, 64))]


@pytest.mark.parametrize("kwargs, match", [
    (dict(enabled_precisions={torch.int16}), "enabled_precisions"),
    (dict(enabled_precisions={"fp4"}), "enabled_precisions"),
    (dict(min_block_size=0), "min_block_size"),
    (dict(torch_executed_ops="aten::relu"), "torch_executed_ops"),
    (dict(device="tpu"), "device"),
    (dict(workspace=1), "unknown compile settings"),
])
def test_bad_setting_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        torchkiln.compile(MLP().eval(), SPEC, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda"), "gpu:0"], ids=str)
def test_a_cuda_device_without_cuda_is_named(device):
    with pytest.raises(ValueError, match=r"^device: cuda(:0)? was asked for but CUDA is not available here$"):
        torchkiln.compile(MLP().eval(), SPEC, device=device)


@pytest.mark.parametrize("inputs", [[], None])
def test_empty_inputs(inputs):
    with pytest.raises(ValueError, match=r"inputs \(or input_signature\) must be a non-empty list"):
        torchkiln.compile(MLP().eval(), inputs)


def test_non_positive_dim():
    with pytest.raises(ValueError, match=r"shape \(2, 0\) has a non-positive dimension 0"):
        torchkiln.Input((2, 0))
    with pytest.raises(ValueError, match="non-positive dimension -1"):
        torchkiln.Input(min_shape=(1, -1), opt_shape=(1, 4), max_shape=(1, 8))


def test_min_opt_max_out_of_order():
    with pytest.raises(ValueError, match="min <= opt <= max"):
        torchkiln.Input(min_shape=(1, 8), opt_shape=(1, 4), max_shape=(1, 16))
    with pytest.raises(ValueError, match="min <= opt <= max"):
        torchkiln.Input(min_shape=(1, 2), opt_shape=(1, 32), max_shape=(1, 16))


def test_rank_mismatch_in_range():
    with pytest.raises(ValueError, match="differ in rank"):
        torchkiln.Input(min_shape=(1,), opt_shape=(1, 4), max_shape=(1, 8))


def test_shape_and_range_together():
    with pytest.raises(ValueError, match="either shape or"):
        torchkiln.Input((1, 4), min_shape=(1, 4), opt_shape=(1, 4), max_shape=(1, 4))


def test_wrong_number_of_inputs_for_the_method():
    with pytest.raises(ValueError, match=r"forward\(\) takes 1 inputs but 2 were given"):
        torchkiln.compile(MLP().eval(), [torchkiln.Input((2, 64)), torchkiln.Input((2, 64))])


def test_unsupported_input_dtype():
    with pytest.raises(ValueError, match="dtype torch.complex64 is not supported"):
        torchkiln.Input((2, 3), dtype=torch.complex64)


def test_input_from_tensor_and_aliases():
    spec = torchkiln.Input.from_tensor(torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last))
    assert spec.opt_shape == (2, 3, 4, 5) and spec.format == torch.channels_last and spec.dtype == torch.float32
    model = MLP().eval()
    compiled = torchkiln.compile(model, [torch.randn(2, 64)], enabled_precisions={"fp32"})
    assert compiled(torch.randn(2, 64)).shape == (2, 10)


def test_enabled_precisions_not_a_collection():
    with pytest.raises(ValueError, match=r"enabled_precisions.*5"):
        torchkiln.compile(MLP().eval(), SPEC, enabled_precisions=5)


def test_input_too_large_fails_fast():
    import time
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"inputs\[0\].*\(1048576, 1048576\).*4398046511104 bytes"):
        torchkiln.compile(MLP().eval(), [torchkiln.Input((1 << 20, 1 << 20))])
    assert time.perf_counter() - start < 5


class NestedTupleIn(torch.nn.Module):
    def forward(self, z: Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        a, (b, c) = z
        return torch.relu(a * b) + torch.sigmoid(c)


def test_input_signature_is_another_name_for_inputs():
    """Torch-TensorRT's tutorial form: one entry per argument, here a nested tuple."""
    model = NestedTupleIn().eval()
    z = (torch.randn(2, 5), (torch.randn(2, 5), torch.randn(2, 5)))
    signature = ((torchkiln.Input((2, 5)), (torchkiln.Input((2, 5)), torchkiln.Input((2, 5)))),)
    compiled = torchkiln.compile(model, input_signature=signature, min_block_size=1)
    assert_matches_eager(compiled(z), model(z))


def test_inputs_and_input_signature_together_are_refused():
    with pytest.raises(ValueError, match="inputs or input_signature .*not both"):
        torchkiln.compile(MLP().eval(), SPEC, input_signature=SPEC)
