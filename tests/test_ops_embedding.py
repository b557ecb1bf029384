"""Embedding lookups and pixel_unshuffle through the whole pipeline (pixel_shuffle is tested with the shape ops)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import check_compiled, check_traced


@pytest.mark.parametrize("indices", [torch.tensor([3, 0, 9, 3]), torch.tensor([[1, 2], [9, 0]]),
                                     torch.tensor([[[4]]]), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)],
                         ids=["1d", "2d", "3d", "int32"])
def test_embedding(indices):
    emb = nn.Embedding(10, 4, padding_idx=0)
    _, report = check_compiled(emb, [indices], min_block_size=1)
    assert report.blocks[0].ops == ("aten::embedding",)


def test_embedding_with_truncate_long_and_double():
    check_traced(nn.Embedding(10, 3), torch.tensor([[1, 7], [9, 0]]), op="aten::embedding",
                 truncate_long_and_double=True)


def test_embedding_of_a_run_time_table():
    check_traced(lambda w, i: F.embedding(i, w), torch.randn(6, 3), torch.tensor([5, 0, 2]), op="aten::embedding")


@pytest.mark.parametrize("shape,r", [((2, 2, 6, 4), 2), ((1, 9, 6), 3), ((2, 3, 1, 4, 4), 4)])
def test_pixel_unshuffle(shape, r):
    _, report = check_compiled(nn.PixelUnshuffle(r), [torch.randn(*shape)], min_block_size=1)
    assert report.blocks[0].ops == ("aten::pixel_unshuffle",)


def test_pixel_unshuffle_non_contiguous():
    check_traced(lambda x: F.pixel_unshuffle(x.transpose(2, 3), 2), torch.randn(1, 2, 6, 4), op="aten::pixel_unshuffle")
