"""Softmax converters through the whole pipeline: softmax/log_softmax (dtype, negative dims) and _softmax."""
import pytest
import torch
import torch.nn.functional as F
from harness import check_fn, check_traced

from torchkiln.lowering import pipeline


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dim):
    check_traced(lambda x: F.softmax(x, dim), torch.randn(2, 3, 4) * 5, op="aten::softmax.int")


def test_softmax_dtype():
    check_traced(lambda x: F.softmax(x, -1, dtype=torch.float64), torch.randn(3, 4), op="aten::softmax.int")


def log_softmax(x):
    return F.log_softmax(x, -2)


def log_softmax_dtype(x):
    return torch.log_softmax(x, 1, torch.float64)


@pytest.mark.parametrize("fn", [log_softmax, log_softmax_dtype])
def test_log_softmax_without_its_lowering_pass(fn, monkeypatch):
    """The unpack_log_softmax pass normally rewrites it; the direct converter takes it when that pass is off."""
    monkeypatch.setattr(pipeline, "GRAPH_PIPELINE", tuple(p for p in pipeline.GRAPH_PIPELINE
                                                          if p != "unpack_log_softmax"))
    x = torch.randn(2, 5, 3) * 20
    x[0, 0, 0] = -1e4  # where softmax underflows, log_softmax stays finite
    check_fn(fn, x, op="aten::log_softmax.int")


def softmax_internal(x):
    return torch._softmax(x, 0, False)


def log_softmax_internal(x):
    return torch._log_softmax(x, -1, False)


@pytest.mark.parametrize("fn,op", [(softmax_internal, "aten::_softmax"), (log_softmax_internal, "aten::_log_softmax")])
def test_internal_softmax(fn, op):
    check_fn(fn, torch.randn(4, 6) * 3, op=op)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_softmax_of_rows_with_nan_and_inf_matches_eager(dtype):
    """ONNX Runtime's double LogSoftmax gives finite values in a row with NaN or +inf; torch gives NaN (OpInfo)."""
    x = torch.randn(6, 5, dtype=dtype)
    x[0, 0], x[1, 2], x[2, 4], x[3], x[4, 1], x[4, 2] = (float("nan"), float("inf"), float("-inf"), float("-inf"),
                                                         float("inf"), float("-inf"))
    check_traced(lambda t: torch.log_softmax(t, 1), x, op="aten::log_softmax.int")


def test_safe_softmax_gives_zero_for_rows_of_minus_infinity():
    x = torch.randn(4, 5)
    x[1] = float("-inf")
    x[2, :2] = float("-inf")
    x[3, 0] = float("nan")
    check_traced(lambda x: torch.ops.aten._safe_softmax(x, 1), x)


def test_softmax_backward_data():
    out = torch.softmax(torch.randn(3, 6), 1)
    check_traced(lambda g, o: torch.ops.aten._softmax_backward_data(g, o, 1, torch.float32), torch.randn(3, 6), out)
