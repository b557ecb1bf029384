"""grouped_query_attention and causal_attention_masks: key/value heads repeated for grouped-query attention are
read unrepeated (SDPA's enable_gqa), and a constant causal mask becomes the causal flag. Compared with eager
PyTorch on real numbers (fp32: 1e-4 * max|ref|) on the reference and onnxruntime backends."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchkiln
from torchkiln.builder import BuildSettings
from torchkiln.builder.pipeline import PASSES
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.engine import Engine

B, HEADS, GROUPS, SEQ, DIM = 2, 6, 2, 7, 8


def _repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    b, g, s, d = x.shape
    return x[:, :, None, :, :].expand(b, g, times, s, d).reshape(b, g * times, s, d)


class GroupedAttention(nn.Module):
    """Projections to HEADS query and GROUPS key/value heads, repeat_kv, SDPA with `mask` (None, "causal": a
    lower-triangular boolean, "window": a causal sliding window, "additive": the causal mask as 0/-inf)."""

    def __init__(self, mask: str | None = None, native: bool = False) -> None:
        super().__init__()
        self.q = nn.Linear(32, HEADS * DIM)
        self.kv = nn.Linear(32, 2 * GROUPS * DIM)
        self.native = native
        keep = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
        if mask == "window":
            keep &= ~torch.ones(SEQ, SEQ, dtype=torch.bool).tril(-3)
        self.register_buffer("mask", None if mask is None else keep if mask != "additive" else
                             torch.zeros(SEQ, SEQ).masked_fill(~keep, float("-inf")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(B, SEQ, HEADS, DIM).transpose(1, 2)
        k, v = self.kv(x).view(B, SEQ, 2, GROUPS, DIM).permute(2, 0, 3, 1, 4).unbind(0)
        if not self.native:
            k, v = _repeat_kv(k, HEADS // GROUPS), _repeat_kv(v, HEADS // GROUPS)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=self.native)


def _network(module: nn.Module, x: torch.Tensor) -> Network:
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input.from_tensor(x)],
                                              backend="reference")
    return Engine.deserialize(data).network


def _attention(net: Network) -> L.AttentionLayer:
    (layer,) = [x for x in net.layers if isinstance(x, L.AttentionLayer)]
    return layer


@pytest.mark.parametrize("native", [False, True], ids=["repeat_kv", "enable_gqa"])
@pytest.mark.parametrize("mask", [None, "causal", "window", "additive"])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_grouped_query_attention_reads_unrepeated_heads_with_eager_values(mask, native, backend):
    torch.manual_seed(0)
    module, x = GroupedAttention(mask, native).eval(), torch.randn(B, SEQ, 32)
    ref = module(x)
    net = _network(module, x)
    layer = _attention(net)
    assert layer.enable_gqa and [t.shape[1] for t in layer.inputs[1:3]] == [GROUPS, GROUPS]
    assert not any(isinstance(t, L.ExpandLayer) for t in net.layers)
    assert layer.causal == (mask in ("causal", "additive")) and len(layer.inputs) == (4 if mask == "window" else 3)
    got = torchkiln.compile(module, inputs=[x], backend=backend, min_block_size=1)(x)
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_key_and_value_repeated_differently_are_left_alone():
    n = Network()
    q = n.add_input("q", torch.float32, (1, 4, 5, 8))
    k, v = (n.add_input(name, torch.float32, (1, g, 5, 8)) for name, g in (("k", 2), ("v", 1)))

    def repeated(t, times):
        unit = n.add_shuffle(t, reshape_dims=(1, t.shape[1], 1, 5, 8)).get_output()
        grown = n.add_expand(unit, (1, t.shape[1], times, 5, 8)).get_output()
        return n.add_shuffle(grown, reshape_dims=(1, 4, 5, 8)).get_output()

    n.mark_output(n.add_attention(q, repeated(k, 2), repeated(v, 4)).get_output())
    assert not PASSES["grouped_query_attention"](n, BuildSettings())


def test_a_transposing_reshape_is_no_head_repeat():
    n = Network()
    q, k, v = (n.add_input(name, torch.float32, (1, 4, 5, 8)) for name in "qkv")
    unit = n.add_shuffle(k, reshape_dims=(1, 2, 1, 10, 8)).get_output()  # not [B, G, 1, S, E] of a [B, G, S, E]
    grown = n.add_expand(unit, (1, 2, 2, 10, 8)).get_output()
    k2 = n.add_shuffle(grown, reshape_dims=(1, 4, 10, 8)).get_output()
    v2 = n.add_input("v2", torch.float32, (1, 4, 10, 8))
    n.mark_output(n.add_attention(q, k2, v2).get_output())
    assert not PASSES["grouped_query_attention"](n, BuildSettings())


@pytest.mark.parametrize("case", ["min-not-inf", "rectangular", "upper", "input"])
def test_masks_that_are_not_the_causal_mask_stay(case):
    n = Network()
    length, keys = (5, 7) if case == "rectangular" else (5, 5)
    q = n.add_input("q", torch.float32, (1, 2, length, 8))
    k, v = (n.add_input(name, torch.float32, (1, 2, keys, 8)) for name in "kv")
    keep = torch.ones(length, keys, dtype=torch.bool).tril()
    if case == "min-not-inf":  # transformers' finfo.min: the same keys blocked, but not the same scores
        value = torch.zeros(length, keys).masked_fill(~keep, torch.finfo(torch.float32).min)
    elif case == "upper":
        value = keep.T.contiguous()
    else:
        value = keep
    mask = n.add_input("mask", torch.bool, (length, keys)) if case == "input" else \
        n.add_constant(value).get_output()
    n.mark_output(n.add_attention(q, k, v, mask).get_output())
    assert not PASSES["causal_attention_masks"](n, BuildSettings())
    assert not _attention(n).causal and len(_attention(n).inputs) == 4


def test_enable_gqa_with_as_many_key_heads_as_query_heads_matches_eager():
    class Odd(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    q, kv = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    module = Odd().eval()
    got = torchkiln.compile(module, inputs=[q, kv, kv], backend="reference", min_block_size=1)(q, kv, kv)
    ref = module(q, kv, kv)
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask", ["causal", "window"])
def test_grouped_query_attention_on_the_cuda_backend_in_fp16(mask):
    torch.manual_seed(0)
    module, x = GroupedAttention(mask).eval().cuda(), torch.randn(B, SEQ, 32, device="cuda")
    ref = module(x).double()
    got = torchkiln.compile(module, [torchkiln.Input(x.shape)], backend="cuda", enabled_precisions={torch.float16},
                            min_block_size=1)(x).double()
    cos = F.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
    assert cos >= 0.999 and (got - ref).abs().max() <= 2e-2 * ref.abs().max()
