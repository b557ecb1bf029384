"""scaled_dot_product_attention through the whole pipeline: masks (bool, float, constant), causal, scale."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from harness import assert_falls_back, check_compiled, check_fn, check_traced, wrap

import torchkiln

OP = "aten::scaled_dot_product_attention"


def _qkv(q_len: int = 5, kv_len: int = 7, batch: tuple[int, ...] = (2, 3)) -> list[torch.Tensor]:
    return [torch.randn(*batch, q_len, 4), torch.randn(*batch, kv_len, 4), torch.randn(*batch, kv_len, 6)]


@pytest.mark.parametrize("kw", [{}, dict(is_causal=True), dict(scale=0.3), dict(is_causal=True, scale=2.0)],
                         ids=["plain", "causal", "scale", "causal-scale"])
@pytest.mark.parametrize("lengths", [(5, 7), (6, 6)])
def test_attention(kw, lengths):
    check_traced(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), *_qkv(*lengths), op=OP)


def test_attention_3d_inputs():
    check_traced(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *_qkv(batch=(3,)), op=OP)


def test_attention_with_run_time_masks():
    q, k, v = _qkv()
    bool_mask = torch.rand(2, 1, 5, 7) > 0.3
    bool_mask[..., 0] = True  # every query sees a key (fully masked rows: the test below)
    float_mask = torch.randn(5, 7)
    check_traced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bool_mask, op=OP)
    check_traced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, float_mask, op=OP)


def test_attention_with_constant_mask():
    mask = torch.randn(3, 5, 7)
    check_traced(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), *_qkv(), op=OP)


def attention_gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_grouped_query_attention_converts():
    q = torch.randn(1, 4, 5, 8)
    kv = torch.randn(1, 2, 5, 8)
    check_fn(attention_gqa, q, kv, kv, engines=1, torch_blocks=0)


def attention_dropout(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


def test_attention_dropout_falls_back():
    """Dropout is random even in eval mode here, so only the partition is checked."""
    report = torchkiln.partition_report(wrap(attention_dropout, 3).eval(), _qkv(), min_block_size=1)
    assert report.num_engine_blocks == 0
    assert_falls_back(report, OP, "dropout_p=0.5")


class SelfAttentionBlock(nn.Module):
    """A transformer block's attention as torchvision's ViT writes it: nn.MultiheadAttention, batch first."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        y, _ = self.attn(y, y, y, need_weights=False)
        return x + y


@pytest.mark.parametrize("frontend", ["script", "trace"])
def test_multihead_attention_module_is_one_engine(frontend):
    model = SelfAttentionBlock().eval()
    x = torch.randn(2, 10, 32)
    module = torch.jit.script(model) if frontend == "script" else torch.jit.trace(model, (x,), check_trace=False)
    with torch.no_grad():  # the inference fast path eager takes, which a compiled module is built for
        _, report = check_compiled(module, [x])
    if frontend == "script":
        assert "aten::_native_multi_head_attention" in report.blocks[0].ops


class MultiheadAttentionWithWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, w = self.attn(x, x, x, need_weights=True)
        assert w is not None
        return y + w.sum()


def test_multihead_attention_returning_weights_still_matches():
    with torch.no_grad():
        check_compiled(torch.jit.script(MultiheadAttentionWithWeights().eval()), [torch.randn(2, 5, 16)],
                       engines=None, torch_blocks=None)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_with_fully_masked_rows_gives_zeros_as_eager(kind):
    """A query whose every key is masked: eager's SDPA gives 0 there (a plain softmax would give NaN)."""
    q, k, v = _qkv()
    keep = torch.rand(2, 1, 5, 7) > 0.3
    keep[..., 0] = True
    keep[0, :, 1], keep[1, :, 4] = False, False  # two fully masked queries
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(ref[0, :, 1], torch.zeros_like(ref[0, :, 1]))
    check_traced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, op=OP)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf"), 1e30])
def test_unmasked_attention_with_special_scores_matches_eager(causal, special):
    """Without a mask (or with the causal one) the plain softmax is exact unless a score is NaN or inf: a query of
    such values (1e30: scores that overflow to -inf for every key) matches eager, as finite ones do."""
    q, k, v = _qkv()
    k[..., 0] = torch.rand(k.shape[:-1]) + 0.5  # every key has a positive first component
    fn = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    check_traced(fn, q, k, v, op=OP)
    q[0, 1, 2] = 0.0
    q[0, 1, 2, 0] = -special
    check_traced(fn, q, k, v, op=OP)


@pytest.mark.parametrize("special", [float("nan"), float("-inf"), -3e38])
def test_attention_with_one_key_left_that_is_special_matches_eager(special):
    """A query whose only unmasked key scores NaN (NaN, where a max that skips NaN sees a row of -inf), -inf (a row
    of -inf: 0) or a finite score whose sum with the others overflows: eager's values in each."""
    q, k, v = _qkv()
    keep = torch.rand(2, 1, 5, 7) > 0.3
    keep[..., 0] = True
    keep[:, :, 2] = False
    keep[:, :, 2, 3] = True  # query 2 sees key 3 only
    q[:, :, 2] = 1.0
    k[:, :, 3] = special / 8 if math.isfinite(special) else special
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert ref[:, :, 2].isnan().all() if math.isnan(special) else ref[:, :, 2].isfinite().all()
    check_traced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, keep, op=OP)


@pytest.mark.parametrize("kind", ["bool", "causal"])
def test_attention_with_inf_and_nan_keys_where_masked_matches_eager(kind):
    """torch adds masks (-inf where masked), so a NaN or +inf score at a masked key still makes NaN."""
    q, k, v = _qkv()
    k[0, 0, 6, 1], k[1, 2, 3, 0] = float("inf"), float("nan")
    keep = torch.ones(5, 7, dtype=torch.bool).tril()  # the causal pattern: key 6 is masked for every query
    if kind == "bool":
        check_traced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, keep, op=OP)
    else:
        check_traced(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, op=OP)


class _LastHiddenState(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_bert_batch_with_an_all_zero_attention_mask_row_matches_eager(shapes):
    """transformers' BERT (its SDPA attention) with one sequence wholly masked: eager gives finite values there."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    model = _LastHiddenState(transformers.BertModel(config)).eval()
    ids, mask = torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    mask[0] = 0
    inputs = None
    if shapes == "dynamic":
        inputs = [torchkiln.Input(min_shape=(2, 4), opt_shape=(2, 8), max_shape=(2, 16), dtype=torch.long)] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracing's warnings about the mask checks
        check_compiled(model, [ids, mask], inputs=inputs)
