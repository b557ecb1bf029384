"""Shape converters through the whole pipeline against eager: slicing, squeeze/unsqueeze, tiling,
reordering, concatenation, padding, pixel shuffle, and views (movedim, ravel, broadcast_to, fliplr/flipud,
mT/mH/adjoint/numpy_T, tril/triu)."""
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchkiln
from harness import assert_falls_back, check_fn, check_traced


def select_neg(x):
    return x.select(-1, -2) + x[1, :, 0].sum()


def slices(x):
    return x[:, 3:] * 2 + x[:, -3:] - x[:, :-100000].sum() + x[:, 0:100][:, ::1][:, 2:5]


def slice_step(x):
    return x[::2, -4:-1:2] + x[1::3, 5:2:1].sum()


def slice_negative_dim(x):
    return x[..., 1:3]


def slice_empty(x):
    return torch.cat([x[:, 2:2], x[:, 3:1]], 1) + 1


def narrow(x):
    return x.narrow(1, 1, 2) + x.narrow(-1, -3, 2)


def narrow_tensor_start(x):
    return torch.narrow(x, 0, torch.tensor(1), 2)


def chunk_uneven(x):
    a, b, c = x.chunk(3, 1)
    return a.sum(1) + b.sum(1) + c.sum(1), c


def chunk_fewer(x):
    parts = torch.chunk(x, 4, -1)  # 5 elements in chunks of 2: only 3 pieces
    return parts[0] * 2, parts[-1], len(parts) + x


def split_size(x):
    a, b = x.split(3, 1)
    return a.mean(), b


def split_sizes(x):
    a, b, c = x.split([1, 2, 2], -1)
    return a + 1, b * 2, c


def split_with_sizes(x):
    a, b = torch.split_with_sizes(x, [3, 2], 1)
    return a, b - 1


def unbind(x):
    a, b, c = x.unbind(1)
    return a + b * c


def unbind_negative(x):
    rows = x.unbind(-2)
    return torch.stack(rows, -1)


def squeeze_all(x):
    return x.squeeze() + 1


def squeeze_dim(x):
    return x.squeeze(0) * x.squeeze(-1).sum() + x.squeeze(1)  # dim 1 is not of size 1: unchanged


def squeeze_dims(x):
    return torch.squeeze(x, [0, -1]) + 1


def unsqueeze(x):
    return x.unsqueeze(0) + x.unsqueeze(-1).sum() + x.unsqueeze(1).sum()


def t(x):
    return x.t() * 2


def t_1d(x):
    return x.t() + x.sum(0).t()


def unflatten(x):
    return x.unflatten(-1, (2, -1)) + 1


def view_as(x, y):
    return x.view_as(y) + y, x.reshape_as(y.t())


def expand(x):
    return x.expand(3, -1, 4) + x.expand(2, 3, 3, 4).sum(0)


def expand_as(x, y):
    return x.expand_as(y) * y


def repeat(x):
    return x.repeat(2, 3), x.repeat(2, 1, 2)


def repeat_interleave_int(x):
    return x.repeat_interleave(2, 1), torch.repeat_interleave(x, 3, -2), x.repeat_interleave(2)


def repeat_interleave_tensor(x):
    return x.repeat_interleave(torch.tensor([1, 0, 2]), dim=0), x.repeat_interleave(torch.tensor(2), dim=1)


def roll(x):
    return x.roll(1, 0) + x.roll(-7, -1), x.roll((1, 2), (1, 0)), x.roll(3)


def flip(x):
    return x.flip(0), x.flip([-1, 0]), x.flip([])


def stack(x, y):
    return torch.stack([x, y], 0), torch.stack([x, y * 2, x], -1), torch.stack((x, y), 1)


def cat_aliases(x, y):
    return torch.concat([x, y], -1), torch.concatenate([x, y], 0)


def constant_pad(x):
    return F.pad(x, (1, 2), value=0.5), torch.constant_pad_nd(x, [1, 1, 0, 2], -1.0), F.pad(x, (-1, 1))


def reflection_pad1d(x):
    return F.pad(x, (2, 1), mode="reflect"), torch.ops.aten.reflection_pad1d(x, [1, 2])


def reflection_pad2d(x):
    return F.pad(x, (1, 2, 2, 1), mode="reflect"), torch.ops.aten.reflection_pad2d(x, [1, 1, 1, 1])


def replication_pad(x):
    return (F.pad(x, (2, 1), mode="replicate"), torch.ops.aten.replication_pad1d(x[0], [1, 3]),
            torch.ops.aten.replication_pad2d(x, [1, 0, 2, 1]))


def replication_pad3d(x):
    return torch.ops.aten.replication_pad3d(x, [1, 0, 2, 1, 1, 1]), F.pad(x, (1, 1, 1, 1, 1, 1), mode="replicate")


def reflection_pad3d(x):
    return torch.ops.aten.reflection_pad3d(x, [1, 2, 1, 0, 1, 1]), F.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect")


def circular_pad(x):
    return F.pad(x, (1, 2, 2, 1), mode="circular")


def permute_0d(x):
    return (x * 2).permute([])


def pixel_shuffle(x):
    return F.pixel_shuffle(x, 2) * 2


R = torch.randn
CASES = [
    (select_neg, [R(3, 4, 5)]),
    (slices, [R(2, 6)]),
    (slice_step, [R(7, 9)]),
    (slice_negative_dim, [R(2, 3, 5)]),
    (slice_empty, [R(2, 4)]),
    (narrow, [R(3, 5)]),
    (narrow_tensor_start, [R(4, 3)]),
    (chunk_uneven, [R(2, 7)]),
    (chunk_fewer, [R(3, 5)]),
    (split_size, [R(2, 5)]),
    (split_sizes, [R(2, 3, 5)]),
    (split_with_sizes, [R(2, 5)]),
    (unbind, [R(2, 3)]),
    (unbind_negative, [R(3, 4, 5)]),
    (squeeze_all, [R(1, 3, 1, 2)]),
    (squeeze_dim, [R(1, 3, 1)]),
    (squeeze_dims, [R(1, 3, 1)]),
    (unsqueeze, [R(2, 3)]),
    (t, [R(2, 5)]),
    (t_1d, [R(5)]),
    (unflatten, [R(2, 3, 8)]),
    (view_as, [R(2, 6), R(3, 4)]),
    (expand, [R(3, 1, 4)]),
    (expand_as, [R(1, 4), R(3, 4)]),
    (repeat, [R(2, 3)]),
    (repeat_interleave_int, [R(3, 2)]),
    (repeat_interleave_tensor, [R(3, 2)]),
    (roll, [R(3, 5)]),
    (flip, [R(3, 4)]),
    (stack, [R(2, 3), R(2, 3)]),
    (cat_aliases, [R(2, 3), R(2, 3)]),
    (constant_pad, [R(2, 3, 4)]),
    (reflection_pad1d, [R(2, 3, 5)]),
    (reflection_pad2d, [R(1, 2, 4, 5)]),
    (replication_pad, [R(2, 3, 4)]),
    (replication_pad3d, [R(1, 2, 3, 3, 4)]),
    (reflection_pad3d, [R(1, 2, 3, 3, 4)]),
    (circular_pad, [R(1, 2, 3, 4)]),
    (pixel_shuffle, [R(2, 8, 3, 4)]),
    (permute_0d, [torch.tensor(-1.5)]),
]


@pytest.mark.parametrize("fn, example", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_shape_op(fn, example):
    check_fn(fn, *example)


def test_pixel_shuffle_with_extra_batch_dims():
    check_fn(pixel_shuffle, R(2, 3, 8, 2, 2))


def non_contiguous_ops(x):
    return x[:, 1:].flip(0).repeat(1, 2), x.unbind(0)[1], torch.stack([x, x], 1).squeeze(-1)


def test_non_contiguous_input():
    check_fn(non_contiguous_ops, R(4, 3).t())


def int_shape_ops(x):
    a, b = x.chunk(2, 1)
    return torch.cat([a.flip(1), b.roll(1, 0)], 1)[1:, ::2].repeat(2, 1), x.unbind(1)[0].unsqueeze(0).expand(2, -1)


@pytest.mark.parametrize("truncate", [False, True])
def test_int64_inputs(truncate):
    check_fn(int_shape_ops, torch.randint(-5, 5, (3, 4)), truncate_long_and_double=truncate)


def int_pad(x):
    return F.pad(x, (1, 1), value=3.0), F.pad(x, (1, 2), mode="replicate")


def test_int64_padding():
    check_fn(int_pad, torch.randint(-5, 5, (2, 3, 4)))


def empty_dims(x):
    e = x[:, 3:3]  # (2, 0): legal everywhere below
    return (e.flip(1), e.roll(1, 1), e.repeat(2, 3), F.pad(e, (1, 1), value=2.0), torch.cat([e, x], 1),
            e.unsqueeze(0).expand(3, 2, 0), torch.stack([e, e], -1), e.chunk(2, 0)[1], e.t())


def test_empty_size_dims():
    check_fn(empty_dims, R(2, 4))


def flip_0d(x):
    return torch.flip(x * 2, [0]) + torch.flip(x, [-1])


def test_flip_of_0d_tensor():
    """torch flips a 0-d tensor along dim 0 or -1 into itself (OpInfo flip); the converter raised IndexError."""
    check_fn(flip_0d, torch.tensor(1.5), op="aten::flip")


def _special(shape):
    """Random values with NaN and +-inf in them (views and masks must carry them as eager does)."""
    x = torch.randn(shape)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return x


VIEWS = {
    "movedim_int": lambda x: torch.movedim(x, 0, 2),
    "movedim_list": lambda x: torch.movedim(x, [0, -1], [-1, 1]),
    "ravel": lambda x: x.ravel(),
    "broadcast_to": lambda x: torch.broadcast_to(x, (5, 2, 3, 4)),
    "fliplr": torch.fliplr,
    "flipud": torch.flipud,
    "mT": lambda x: x.mT,
    "mH": lambda x: x.mH,
    "adjoint": lambda x: x.adjoint(),
    "H": lambda x: x[0].H,
    "numpy_T": lambda x: x.T,  # on a 3-d tensor: deprecated but traced as aten::numpy_T
    "tril": torch.tril,
    "tril_above": lambda x: torch.tril(x, 1),
    "triu_below": lambda x: torch.triu(x, -1),
    "triu_empty": lambda x: torch.triu(x, 5),
}


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("name", VIEWS)
def test_view_ops(name, backend):
    """Traced graphs emit these ops as they are (aten::mT, aten::mH for adjoint, aten::numpy_T for .T)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_traced(VIEWS[name], _special((2, 3, 4)), backend=backend)


@pytest.mark.parametrize("fn", [lambda x: x.mT * 2, lambda x: x.H * 2], ids=["mT", "H"])
def test_matrix_transpose_of_0d_is_identity(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_traced(fn, torch.tensor(3.0))


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("x, dims", [(torch.tensor(3.0), (0, 0)), (torch.tensor(3.0), (0, -1)),
                                     (torch.randn(5), (0, -1))], ids=["0-d", "0-d -1", "1-d"])
def test_transpose_of_0d_and_1d_is_identity(x, dims, backend):
    """A 0-d tensor takes dims 0 and -1 (OpInfo transpose); the converter's swap indexed past its empty perm."""
    check_traced(lambda t: torch.transpose(t, *dims) * 2, x, op="aten::transpose.int", backend=backend)


def test_tril_of_bool():
    check_traced(lambda x: torch.triu(x > 0, 1), torch.randn(4, 6))


def test_tril_of_dynamic_matrix_stays_in_pytorch():
    spec = torchkiln.Input(min_shape=(2, 3), opt_shape=(4, 3), max_shape=(8, 3), dtype=torch.float32)
    _, report = check_traced(torch.tril, torch.randn(4, 3), inputs=[spec], engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::tril", "static sizes")


# The *_copy and unsafe_* forms of view and split ops: the same converters (engine tensors are never aliased).
COPY_FORMS = [
    ("view_copy", lambda x: torch.view_copy(x, [4, 6])),
    ("permute_copy", lambda x: torch.permute_copy(x, [2, 0, 1])),
    ("t_copy", lambda x: torch.t_copy(x[0])),
    ("transpose_copy", lambda x: torch.transpose_copy(x, 0, 2)),
    ("squeeze_copy", lambda x: torch.squeeze_copy(x[:, :1], 1)),
    ("unsqueeze_copy", lambda x: torch.unsqueeze_copy(x, 1)),
    ("expand_copy", lambda x: torch.expand_copy(x[:, :1], [2, 5, 4])),
    ("narrow_copy", lambda x: torch.narrow_copy(x, 2, 1, 2)),
    ("unbind_copy", lambda x: torch.unbind_copy(x, 1)),
    ("split_with_sizes_copy", lambda x: torch.split_with_sizes_copy(x, [1, 2], 1)),
    ("unsafe_chunk", lambda x: torch.unsafe_chunk(x, 2, 2)),
    ("unsafe_split", lambda x: torch.unsafe_split(x, 2, 1)),
    ("conj_physical", torch.conj_physical),
    ("real", torch.real),
]


@pytest.mark.parametrize("name, fn", COPY_FORMS, ids=[n for n, _ in COPY_FORMS])
def test_copy_and_unsafe_forms(name, fn):
    x = torch.randn(2, 3, 4)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    compiled, _ = check_traced(fn, x)
    out, again = compiled(x), compiled(x)
    for a, b in zip(out if isinstance(out, (list, tuple)) else [out], again if isinstance(again, (list, tuple))
                    else [again]):
        assert a.data_ptr() != x.data_ptr() and a.data_ptr() != b.data_ptr()  # a fresh tensor, as eager's copy


def test_channel_shuffle():
    check_traced(lambda x: F.channel_shuffle(x, 3), torch.randn(2, 6, 4, 5))
    check_traced(lambda x: F.channel_shuffle(x, 2), torch.randn(2, 6, 4))


@pytest.mark.parametrize("name, fn", [
    ("tensor_split_sections", lambda x: torch.tensor_split(x, 3, 1)),
    ("tensor_split_indices", lambda x: torch.tensor_split(x, [1, 4, 9], 1)),
    ("hsplit", lambda x: torch.hsplit(x, 5)),
    ("hsplit_1d", lambda x: torch.hsplit(x[0, :, 0], [2, 3])),
    ("vsplit", lambda x: torch.vsplit(x, [1])),
    ("dsplit", lambda x: torch.dsplit(x, 2)),
    ("atleast", lambda x: (torch.atleast_1d(x[0, 0, 0]), torch.atleast_2d(x[0, 0]), torch.atleast_3d(x[0]),
                           torch.atleast_3d(x[0, 0]), torch.atleast_3d(x[0, 0, 0]), torch.atleast_2d(x))),
    ("atleast_sequence", lambda x: torch.atleast_2d([x[0, 0, 0], x[0, 0]]) + torch.atleast_3d((x[0], x))),
    ("hstack", lambda x: (torch.hstack([x, x[:, :2]]), torch.hstack([x[0, 0], x[1, 0, :3], x[0, 0, 0]]))),
    ("vstack", lambda x: (torch.vstack([x[0], x[1, :1]]), torch.vstack([x[0, 0], x[1, 1]]))),
    ("dstack", lambda x: (torch.dstack([x[0], x[1]]), torch.dstack([x[0, 0], x[1, 1]]))),
    ("column_stack", lambda x: torch.column_stack([x[0, :, 0], x[0], x[1, :, 0]])),
], ids=lambda v: v if isinstance(v, str) else "")
def test_splits_and_stacks(name, fn):
    x = torch.randn(2, 5, 4)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    check_traced(fn, x)


@pytest.mark.parametrize("name, fn", [
    *((f"rot90_k{k}_{dims}", lambda x, k=k, dims=dims: torch.rot90(x, k, dims)) for k in (1, 2, 3, -1, 4)
      for dims in ([0, 1], [2, 0])),
    ("block_diag", lambda x: torch.block_diag(x[0], x[1, 0], x[0, 0, 0], x[1, :2, :1])),
    ("cartesian_prod", lambda x: torch.cartesian_prod(x[0, 0], x[1, 1, :2], x[0, 2, :3])),
    ("cartesian_prod_one", lambda x: torch.cartesian_prod(x[0, 0])),
    ("unfold", lambda x: x.unfold(2, 2, 1)),
    ("unfold_step", lambda x: x.unfold(1, 2, 2)),
    ("unfold_copy", lambda x: torch.unfold_copy(x, 0, 1, 1)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_reorders_and_blocks(name, fn):
    x = torch.randn(2, 3, 4)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    check_traced(fn, x)


@pytest.mark.parametrize("fn", [torch.fft.fftshift, torch.fft.ifftshift], ids=lambda v: v.__name__)
@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
def test_fftshift_of_a_real_tensor(fn, dim):
    x = torch.randn(3, 5, 4)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    check_traced(lambda x: fn(x, dim=dim), x)


@pytest.mark.parametrize("shape, kwargs", [
    ((2, 2, 16, 16), dict(kernel_size=3, padding=1)),  # RAFT's upsample_flow: 3x3 neighbourhoods of the flow
    ((2, 3, 9, 7), dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 0), stride=(2, 3))),
    ((3, 8, 1), dict(kernel_size=(3, 1), padding=(1, 0))),  # ConvBert's span convolution, unbatched
])
def test_im2col(shape, kwargs):
    x = R(*shape)
    x[0, 0, 0] = float("inf")  # slices move values unchanged: no inf * 0 as a one-hot convolution would give
    check_traced(lambda t: F.unfold(t, **kwargs) * 2, x, op="aten::im2col")


@pytest.mark.parametrize("size, kwargs", [
    ((8, 8), dict(kernel_size=3, padding=1)),  # VOLO's outlook attention folds 3x3 neighbourhoods back
    ((9, 7), dict(kernel_size=(3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1))),
    ((8, 8), dict(kernel_size=2, stride=2)),  # taps that do not overlap
    ((14, 14), dict(kernel_size=3, padding=1, stride=2)),  # the last row and column of taps fall outside
])
@pytest.mark.parametrize("batched", [True, False])
def test_col2im(size, kwargs, batched):
    """fold, the inverse arrangement of unfold: overlapping taps summed; an infinity stays one (not NaN)."""
    blocks = F.unfold(R(1, 3, *size), **kwargs).shape[1:]
    x = R(2, *blocks) if batched else R(*blocks)
    x.view(-1)[5] = float("inf")
    check_traced(lambda t: F.fold(t * 2, size, **kwargs), x, op="aten::col2im")


def cat_onto_an_empty_cache(x, y):
    """transformers' DynamicLayer starts its keys as torch.tensor([]) and concatenates onto them (XLM, FlauBERT):
    eager skips a 1-d empty tensor in cat, whatever the other tensors' rank, though its dtype still promotes."""
    empty = torch.zeros(0, dtype=torch.float64)
    return torch.cat([torch.zeros(0), x, y], dim=-2), torch.cat([x, empty], dim=1), torch.cat([empty, empty * 2], 0)


def test_cat_skips_one_dimensional_empty_tensors():
    check_traced(cat_onto_an_empty_cache, R(2, 3, 4), R(2, 3, 4), op="aten::cat")
