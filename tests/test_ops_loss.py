"""Loss converters (conversion/converters/loss.py) and broadcast_tensors through the whole pipeline against eager: each
reduction, NaN and infinities in the input, and a target that broadcasts."""
import pytest
import torch
import torch.nn.functional as F
from harness import assert_falls_back, check_traced

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30])


def _inputs(kind):
    x = torch.randn(4, 6)
    x[0] = SPECIAL
    if kind == "sign":  # targets of +-1
        return x, torch.where(torch.rand(4, 6) > 0.5, 1.0, -1.0)
    if kind == "pos":
        return x, torch.rand(4, 6) * 3
    return x, torch.randn(4, 6)


LOSSES = [
    ("mse", lambda x, t, r: F.mse_loss(x, t, reduction=r), "any"),
    ("l1", lambda x, t, r: F.l1_loss(x, t, reduction=r), "any"),
    ("huber", lambda x, t, r: F.huber_loss(x, t, reduction=r, delta=0.7), "any"),
    ("smooth_l1", lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.5), "any"),
    ("smooth_l1_beta0", lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.0), "any"),
    ("soft_margin", lambda x, t, r: F.soft_margin_loss(x, t, reduction=r), "sign"),
    ("hinge_embedding", lambda x, t, r: F.hinge_embedding_loss(x, t, margin=0.5, reduction=r), "sign"),
    ("margin_ranking", lambda x, t, r: F.margin_ranking_loss(x, x.flip(0), t, margin=0.2, reduction=r), "sign"),
    ("kl_div", lambda x, t, r: F.kl_div(x, t, reduction=r), "pos"),
    ("kl_div_log_target", lambda x, t, r: F.kl_div(x, t.log(), reduction=r, log_target=True), "pos"),
    ("poisson_nll", lambda x, t, r: F.poisson_nll_loss(x, t, reduction=r), "pos"),
    ("poisson_nll_full", lambda x, t, r: F.poisson_nll_loss(x.abs(), t, log_input=False, full=True, reduction=r),
     "pos"),
]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("name, loss, kind", LOSSES, ids=[n for n, _, _ in LOSSES])
def test_loss(name, loss, kind, reduction):
    x, t = _inputs(kind)
    check_traced(lambda x, t: loss(x, t, reduction), x, t)
    check_traced(lambda x, t: loss(x, t, reduction), x[1:], t[1:])  # finite: a finite reduced value


def test_loss_target_broadcasts():
    check_traced(lambda x, t: F.mse_loss(x, t.expand(3, 4)), torch.randn(3, 4), torch.randn(1, 4))


def test_broadcast_tensors():
    check_traced(lambda a, b, c: torch.broadcast_tensors(a, b, c), torch.randn(3, 1), torch.randn(4), torch.randn(1, 1))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_triplet_margin_loss(swap, reduction):
    a, p, n = torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4)
    check_traced(lambda a, p, n: F.triplet_margin_loss(a, p, n, margin=0.5, p=1.5, swap=swap, reduction=reduction),
                 a, p, n)
    a[0, 0], n[1, 1] = float("nan"), float("inf")
    check_traced(lambda a, p, n: F.triplet_margin_loss(a, p, n, swap=swap, reduction=reduction), a, p, n)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("loss", ["nll", "cross_entropy"])
def test_class_index_losses(loss, weighted, reduction):
    fn = F.nll_loss if loss == "nll" else F.cross_entropy
    weight = torch.rand(5) + 0.5 if weighted else None
    x, t = torch.randn(6, 5), torch.tensor([0, 4, 2, -100, 1, 4])
    x[2, 2], x[4, 0] = float("nan"), float("inf")
    check_traced(lambda x, t: fn(x, t, weight=weight, reduction=reduction), x, t)
    check_traced(lambda x, t: fn(x, t, weight=weight, reduction=reduction, ignore_index=4), x, t.clamp(min=0))
    check_traced(lambda x, t: fn(x, t, weight=weight, reduction=reduction), torch.randn(2, 5, 3, 2),
                 torch.randint(0, 5, (2, 3, 2)))  # spatial dims
    check_traced(lambda x, t: fn(x, t, weight=weight, reduction=reduction), torch.randn(5), torch.tensor(3))


def test_cross_entropy_of_probabilities_stays_in_pytorch():
    _, report = check_traced(lambda x, t: F.cross_entropy(x, t) * 2, torch.randn(3, 4), torch.rand(3, 4).softmax(1),
                             engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::cross_entropy_loss", "class probabilities")


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weights", [(None, None), ("weight", None), (None, "pos_weight"), ("weight", "pos_weight")])
def test_binary_cross_entropy_with_logits(weights, reduction):
    weight = torch.rand(6) if weights[0] else None
    pos_weight = torch.rand(6) * 2 if weights[1] else None
    x, t = torch.randn(4, 6) * 5, torch.rand(4, 6)
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    check_traced(lambda x, t: F.binary_cross_entropy_with_logits(x, t, weight, reduction=reduction,
                                                                 pos_weight=pos_weight), x, t)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cosine_embedding_loss(reduction):
    a, b, t = torch.randn(6, 4), torch.randn(6, 4), torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 1.0])
    check_traced(lambda a, b, t: F.cosine_embedding_loss(a, b, t, margin=0.2, reduction=reduction), a, b, t)
    a[0, 0], b[1, 1] = float("nan"), float("inf")
    check_traced(lambda a, b, t: F.cosine_embedding_loss(a, b, t, reduction=reduction), a, b, t)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multi_margin_loss(p, reduction):
    x, t, w = torch.randn(5, 4), torch.tensor([0, 3, 1, 1, 2]), torch.rand(4) + 0.5
    check_traced(lambda x, t: F.multi_margin_loss(x, t, p=p, margin=0.7, reduction=reduction), x, t)
    x[0, 1], x[2, 2] = float("nan"), float("inf")  # eager's loop skips a NaN term (z > 0 is false)
    check_traced(lambda x, t: F.multi_margin_loss(x, t, p=p, weight=w, reduction=reduction), x, t)
    check_traced(lambda x, t: F.multi_margin_loss(x, t, p=p, reduction=reduction), x[0], t[0])
