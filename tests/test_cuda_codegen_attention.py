"""The generated attention kernel (runtime/backends/cuda/codegen/attention.py) against
torch.nn.functional.scaled_dot_product_attention in float32 on the same half-precision inputs: boolean, additive and
broadcast masks, causal attention, grouped-query heads, head dims that are not powers of two, lengths that are not
multiples of the tile, strided heads, and rows that see no key. On a machine without CUDA the kernel runs in
Triton's CPU interpreter. Bound: cosine >= 0.9999 and max abs error <= 5e-3 x max|ref| (the probabilities are
rounded to the value dtype before they weight the values, as SDPA's fused kernels do)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from harness import run_plan_eagerly

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import EngineInputError  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import planner  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.attention import CONFIGS, Attention, supported  # noqa: E402
from torchkiln.runtime.executor import ReferenceExecutor  # noqa: E402
from torchkiln.runtime.plan import Kernel  # noqa: E402

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy on -inf in the interpreter
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
F16, BF16 = torch.float16, torch.bfloat16


def attention_layer(q, k, v, mask=None, causal=False, scale=None, gqa=False):
    net = Network()
    ins = [net.add_input(n, t.dtype, tuple(t.shape)) for n, t in zip("qkvm", (q, k, v, mask)) if t is not None]
    layer = net.add_attention(*ins[:3], ins[3] if mask is not None else None, causal=causal, scale=scale,
                              enable_gqa=gqa)
    net.mark_output(layer.get_output())
    return net, layer


def check(q, k, v, mask=None, causal=False, scale=None, gqa=False, config="generated:64x64"):
    """The kernel's output against SDPA in float32; returns it, in the kernel's layout."""
    _, layer = attention_layer(q, k, v, mask, causal, scale, gqa)
    assert supported(layer, [tuple(t.shape) for t in (q, k, v, mask) if t is not None]) is None
    got = Attention(layer, config)(*(t.to(DEVICE) for t in (q, k, v)), None if mask is None else mask.to(DEVICE))
    ref_mask = mask.float() if mask is not None and mask.is_floating_point() else mask
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=ref_mask, is_causal=causal,
                                         scale=scale, enable_gqa=gqa)
    values = got.cpu().float()
    assert values.shape == ref.shape
    assert F.cosine_similarity(values.flatten(), ref.flatten(), 0) >= 0.9999
    assert (values - ref).abs().max() <= 5e-3 * ref.abs().max(), (values - ref).abs().max()
    return got


def qkv(b, h, lq, lk, d, dtype=F16, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_heads = kv_heads or h
    return (torch.randn(b, h, lq, d, generator=g).to(dtype), torch.randn(b, kv_heads, lk, d, generator=g).to(dtype),
            torch.randn(b, kv_heads, lk, d, generator=g).to(dtype))


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("shape", [(2, 2, 20, 37, 64), (1, 1, 130, 70, 32), (2, 1, 5, 5, 16), (1, 1, 9, 200, 128)],
                         ids=["short", "long_queries", "tiny", "d128"])
def test_no_mask(shape, config):
    check(*qkv(*shape), config=config)


@pytest.mark.parametrize("dtype", [F16, pytest.param(BF16, marks=pytest.mark.skipif(
    DEVICE.type == "cpu", reason="Triton's interpreter does not run bfloat16 products"))])
def test_head_dim_not_a_power_of_two_and_scale(dtype):
    check(*qkv(2, 2, 17, 33, 40, dtype), scale=0.3)


def test_boolean_key_padding_mask_broadcast_over_heads_and_queries():
    q, k, v = qkv(2, 4, 24, 40, 64)
    mask = torch.ones(2, 1, 1, 40, dtype=torch.bool)
    mask[1, ..., 30:] = False
    check(q, k, v, mask)


def test_rows_that_see_no_key_are_zeros():
    q, k, v = qkv(2, 2, 8, 12, 32)
    mask = torch.rand(2, 1, 8, 12, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 0, 3] = False
    got = check(q, k, v, mask).cpu()
    assert torch.equal(got[0, :, 3], torch.zeros_like(got[0, :, 3]))


@pytest.mark.parametrize("mask_dtype", [torch.float32, F16])
def test_additive_mask_per_head_with_minus_inf(mask_dtype):
    q, k, v = qkv(1, 3, 20, 20, 64)
    mask = torch.randn(3, 20, 20, generator=torch.Generator().manual_seed(2))
    mask[:, :, 5] = float("-inf")
    check(q, k, v, mask.to(mask_dtype))


def test_two_d_mask_broadcast_over_batch_and_heads():
    q, k, v = qkv(2, 2, 10, 14, 32)
    check(q, k, v, torch.randn(10, 14, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("lengths", [(70, 70), (20, 45)], ids=["square", "more_keys"])
def test_causal(lengths, config):
    check(*qkv(1, 2, *lengths, 32), causal=True, config=config)


def test_grouped_query_heads():
    check(*qkv(1, 4, 16, 16, 32, kv_heads=2), gqa=True)


def test_heads_read_in_place_from_a_projections_layout():
    """q, k and v as views of one [B, L, 3, H, D] tensor (a fused projection's output), permuted: nothing copied;
    the output is [B, H, L, D] over [B, L, H, D] memory."""
    x = torch.randn(2, 19, 3, 2, 32, generator=torch.Generator().manual_seed(4)).half()
    q, k, v = (x[:, :, j].transpose(1, 2) for j in range(3))
    assert check(q, k, v).transpose(1, 2).is_contiguous()


def test_what_the_kernel_refuses():
    def why(q, k, v, mask=None, gqa=False):
        return supported(attention_layer(q, k, v, mask, gqa=gqa)[1], [tuple(t.shape) for t in (q, k, v, mask)
                                                                       if t is not None])
    assert "float16 or bfloat16" in why(*(t.float() for t in qkv(1, 2, 4, 4, 16)))
    assert "over 128" in why(*qkv(1, 2, 4, 4, 256))
    assert "[batch, heads, length, head dim]" in why(*(t[0] for t in qkv(1, 2, 4, 4, 16)))
    assert why(*qkv(1, 4, 4, 4, 16, kv_heads=2), gqa=True) is None


def test_inputs_that_do_not_pair_are_a_named_error():
    q, k, v = qkv(1, 2, 4, 6, 16)
    _, layer = attention_layer(q, k, v)
    with pytest.raises(EngineInputError, match="attention layer .* do not pair"):
        Attention(layer, "generated:64x64")(q, k[..., :8], v, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU plans attention by timing: test_cuda_backend")
def test_a_plan_runs_attention_as_the_generated_kernel():
    """An encoder's attention step with the generated tactic, run through the runner's step maker, against the
    reference executor."""
    q, k, v = qkv(2, 2, 12, 12, 32)
    mask = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    mask[0, ..., 9:] = False
    net, _ = attention_layer(q, k, v, mask)
    plan = planner.make_plan(net, torch.device("cpu"), BackendOptions(timing_iterations=0))
    [at] = [j for j, kernel in enumerate(plan.kernels) if kernel.op == "attention"]
    kernels = list(plan.kernels)
    kernels[at] = Kernel("generated", "attention", (("config", "generated:64x32"),))
    out = run_plan_eagerly(net, dataclasses.replace(plan, kernels=kernels), [q, k, v, mask])[0].float()
    ref = ReferenceExecutor(net, torch.device("cpu")).run([t.float() if t.is_floating_point() else t
                                                           for t in (q, k, v, mask)])[0]
    assert (out - ref).abs().max() <= 5e-3 * ref.abs().max()


def test_the_fusion_report_names_the_generated_attention_kernel():
    """A pointwise layer making the query stays a step of its own before the generated attention step, and the
    report says why."""
    from torchkiln.ir import layers as L
    from torchkiln.runtime.backends.cuda import fusion_report

    q, k, v = qkv(1, 2, 8, 8, 16)
    net = Network()
    ins = [net.add_input(n, t.dtype, tuple(t.shape)) for n, t in zip("qkv", (q, k, v))]
    scaled = net.add_activation(ins[0], L.ActivationType.RELU).get_output()
    net.mark_output(net.add_attention(scaled, ins[1], ins[2]).get_output())
    plan = planner.make_plan(net, torch.device("cpu"), BackendOptions(timing_iterations=0))
    kernels = [Kernel("generated", "attention", (("config", "generated:64x64"),)) if kernel.op == "attention"
               else kernel for kernel in plan.kernels]
    [edge] = fusion_report.unfused_edges(net, dataclasses.replace(plan, kernels=kernels))
    assert "generated attention kernel" in edge.reason and "no prologue" in edge.reason
