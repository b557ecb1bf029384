"""The one harness's comparison with eager: NaN and infinities must match eager's, signs included."""
import pytest
import torch
from harness import assert_matches_eager

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("out, ref", [([INF], [-INF]), ([NAN], [INF]), ([INF], [NAN]), ([1.0, INF], [1.0, 2.0]),
                                      ([-INF, 0.5], [NAN, 0.5])],
                         ids=["inf-sign", "nan-for-inf", "inf-for-nan", "inf-for-finite", "-inf-for-nan"])
def test_special_values_that_differ_are_named(out, ref):
    with pytest.raises(AssertionError, match=r"at \(\d,\) where eager gives"):
        assert_matches_eager(torch.tensor(out), torch.tensor(ref))


def test_equal_special_values_pass():
    values = torch.tensor([INF, -INF, NAN, 0.0, -1.5])
    assert_matches_eager(values.clone(), values)


def test_min_cosine():
    ref = torch.tensor([1.0, -1.0, 0.5, 2.0])
    assert_matches_eager(ref + 1e-3, ref, rtol=1e-2, min_cosine=0.999)
    with pytest.raises(AssertionError, match="cosine similarity"):
        assert_matches_eager(torch.tensor([1.0, 1.0, 0.5, 2.0]) * 0.01, ref * 0.01, rtol=1.0, min_cosine=0.999)
