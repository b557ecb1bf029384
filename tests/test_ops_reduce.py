"""Reduction converters through the whole pipeline: sum/mean/prod, amax/amin and max/min over everything,
all/any, cumsum/cumprod, norms, var/std; negative dims, keepdim, dtypes, int64 inputs."""
import math

import pytest
import torch
import torch.nn.functional as F
from harness import check_fn, check_traced

X = (2, 3, 4)


def _floats(*shape: int) -> torch.Tensor:
    return torch.randn(*shape) * 2


def _with_nan(x: torch.Tensor) -> torch.Tensor:
    x.view(-1)[1] = float("nan")
    return x


def _ints(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(-4, 5, shape, dtype=dtype)


CASES = [  # (id, fn, example input, op that must run in the engine)
    ("sum-all", lambda x: x.sum(), _floats(*X), "aten::sum"),
    ("sum-dims-keepdim", lambda x: x.sum((0, -1), keepdim=True), _floats(*X), "aten::sum.dim_IntList"),
    ("sum-negative-dim", lambda x: x.sum(-2), _floats(*X), "aten::sum.dim_IntList"),
    ("sum-dtype", lambda x: torch.sum(x, 1, dtype=torch.float64), _floats(*X), "aten::sum.dim_IntList"),
    ("sum-int64", lambda x: x.sum(1), _ints(*X), "aten::sum.dim_IntList"),
    ("sum-int32-promotes", lambda x: x.sum(), _ints(*X, dtype=torch.int32), "aten::sum"),
    ("sum-bool", lambda x: x.sum(0), _floats(*X) > 0, "aten::sum.dim_IntList"),
    ("mean-dims", lambda x: x.mean((1, 2)), _floats(*X), "aten::mean.dim"),
    ("mean-all-dtype", lambda x: x.mean(dtype=torch.float64), _floats(*X), "aten::mean"),
    ("prod-all", lambda x: x.prod(), torch.rand(*X) + 0.5, "aten::prod"),
    ("prod-dim-keepdim", lambda x: x.prod(-1, keepdim=True), _floats(*X), "aten::prod.dim_int"),
    ("prod-int32-promotes", lambda x: x.prod(1), _ints(*X, dtype=torch.int32), "aten::prod.dim_int"),
    ("prod-dtype", lambda x: x.prod(0, dtype=torch.float64), _floats(*X), "aten::prod.dim_int"),
    ("amax", lambda x: x.amax((0, 2)), _floats(*X), "aten::amax"),
    ("amin-keepdim", lambda x: x.amin(-1, keepdim=True), _floats(*X), "aten::amin"),
    ("amax-int64", lambda x: torch.amax(x, 1), _ints(*X), "aten::amax"),
    ("max-all", lambda x: x.max(), _floats(*X), "aten::max"),
    ("min-all-int", lambda x: x.min(), _ints(*X), "aten::min"),
    ("max-all-nan", lambda x: x.max(), _with_nan(_floats(*X)), "aten::max"),
    ("all", lambda x: x.all(), _floats(*X) > -3, "aten::all"),
    ("all-dim", lambda x: x.all(1), _ints(*X), "aten::all.dim"),
    ("all-dims", lambda x: torch.all(x, dim=(0, -1)), _floats(*X).round(), "aten::all.dims"),
    ("any-dim-keepdim", lambda x: x.any(-1, keepdim=True), _floats(*X) > 2, "aten::any.dim"),
    ("any-dims", lambda x: torch.any(x, dim=(1, 2), keepdim=True), _ints(*X), "aten::any.dims"),
    ("any-uint8", lambda x: x.any(0), _ints(*X).abs().to(torch.uint8), "aten::any.dim"),
    ("cumsum", lambda x: x.cumsum(1), _floats(*X), "aten::cumsum"),
    ("cumsum-negative-dim-dtype", lambda x: torch.cumsum(x, -1, dtype=torch.float64), _floats(*X), "aten::cumsum"),
    ("cumsum-int32-promotes", lambda x: x.cumsum(0), _ints(*X, dtype=torch.int32), "aten::cumsum"),
    ("cumsum-int32-dtype", lambda x: torch.cumsum(x * 2**29, 2, dtype=torch.int32), _ints(*X), "aten::cumsum"),
    ("cumprod-int16-dtype", lambda x: torch.cumprod(x * 40, -1, dtype=torch.int16), _ints(*X), "aten::cumprod"),
    ("cumprod", lambda x: x.cumprod(2), torch.rand(*X) + 0.5, "aten::cumprod"),
    ("var-dim", lambda x: x.var(1), _floats(*X), "aten::var.dim"),
    ("var-all-biased", lambda x: x.var(unbiased=False), _floats(*X), "aten::var"),
    ("var-correction", lambda x: torch.var(x, (0, 2), correction=2, keepdim=True), _floats(*X), "aten::var.correction"),
    ("var-fraction", lambda x: torch.var(x, -1, correction=0.5), _floats(*X), "aten::var.correction"),
    ("var-too-few", lambda x: torch.var(x, 0, correction=3), _floats(*X), "aten::var.correction"),
    ("std-dim-keepdim", lambda x: x.std(-1, keepdim=True), _floats(*X), "aten::std.dim"),
    ("std-all", lambda x: x.std(), _floats(*X), "aten::std.correction"),
    ("std-correction", lambda x: torch.std(x, 1, correction=0), _floats(*X), "aten::std.correction"),
    ("non-contiguous", lambda x: x.transpose(0, 2).sum(-1), _floats(*X), "aten::sum.dim_IntList"),
]


@pytest.mark.parametrize("fn,x,op", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.filterwarnings("ignore:var.*degrees of freedom")
def test_reduction(fn, x, op):
    check_traced(fn, x, op=op)


TRUNCATED = [
    ("sum", lambda x: x.sum(1), "aten::sum.dim_IntList"),
    ("prod", lambda x: x.prod(), "aten::prod"),
    ("amax", lambda x: x.amax(0), "aten::amax"),
    ("cumsum", lambda x: x.cumsum(-1), "aten::cumsum"),
    ("any", lambda x: x.any(1), "aten::any.dim"),
]


@pytest.mark.parametrize("fn,op", [c[1:] for c in TRUNCATED], ids=[c[0] for c in TRUNCATED])
def test_int64_reduction_with_truncate_long_and_double(fn, op):
    """The engine computes in int32; the output still has eager's dtype (int64)."""
    check_traced(fn, _ints(*X), op=op, truncate_long_and_double=True)


def all_over_no_dims(x):
    return torch.all(x, [])


def any_over_no_dims(x):
    return torch.any(x, [])


def all_over_none(x):
    return torch.all(x, None, True)


@pytest.mark.parametrize("fn,x", [(all_over_no_dims, _with_nan(_floats(*X).floor())),
                                  (any_over_no_dims, _ints(*X).abs().to(torch.uint8)),
                                  (all_over_none, _floats(*X).floor())])
def test_all_any_dims_overload_scripted(fn, x):
    check_fn(fn, x, op="aten::" + fn.__name__[:3] + ".dims")


NORMS = [
    ("torch-norm", lambda x: torch.norm(x, dim=1), "aten::linalg_vector_norm"),
    ("torch-norm-p1-keepdim", lambda x: torch.norm(x, p=1, dim=(1, 2), keepdim=True), "aten::linalg_vector_norm"),
    ("torch-norm-fro", lambda x: torch.norm(x, p="fro", dim=(0, 2)), "aten::linalg_vector_norm"),
    ("torch-norm-all", lambda x: torch.norm(x), "aten::linalg_vector_norm"),
    ("vector-inf", lambda x: torch.linalg.vector_norm(x, math.inf, dim=-1), "aten::linalg_vector_norm"),
    ("vector-minus-inf", lambda x: torch.linalg.vector_norm(x, -math.inf, dim=0), "aten::linalg_vector_norm"),
    ("vector-0", lambda x: torch.linalg.vector_norm(x, 0, dim=1), "aten::linalg_vector_norm"),
    ("vector-3", lambda x: torch.linalg.vector_norm(x, 3), "aten::linalg_vector_norm"),
    ("vector-fraction", lambda x: torch.linalg.vector_norm(x, 0.5, dim=(0, 1)), "aten::linalg_vector_norm"),
    ("vector-negative", lambda x: torch.linalg.vector_norm(x, -1.5, dim=2), "aten::linalg_vector_norm"),
    ("vector-dtype", lambda x: torch.linalg.vector_norm(x, dim=1, dtype=torch.float64), "aten::linalg_vector_norm"),
    ("linalg-default", lambda x: torch.linalg.norm(x), "aten::linalg_norm"),
    ("linalg-vector-dim", lambda x: torch.linalg.norm(x, 4, dim=-1), "aten::linalg_norm"),
    ("linalg-fro-dims", lambda x: torch.linalg.norm(x, dim=(0, 2)), "aten::linalg_norm"),
    ("linalg-fro-str", lambda x: torch.linalg.norm(x, "fro", dim=(1, 2), keepdim=True), "aten::linalg_norm.ord_str"),
    ("matrix-1", lambda x: torch.linalg.norm(x, 1, dim=(1, 2)), "aten::linalg_norm"),
    ("matrix-minus-1-keepdim", lambda x: torch.linalg.norm(x, -1, dim=(2, 0), keepdim=True), "aten::linalg_norm"),
    ("matrix-inf", lambda x: torch.linalg.norm(x, math.inf, dim=(-1, -2)), "aten::linalg_norm"),
    ("matrix-minus-inf", lambda x: torch.linalg.norm(x, -math.inf, dim=(0, 1)), "aten::linalg_norm"),
]


@pytest.mark.parametrize("fn,op", [c[1:] for c in NORMS], ids=[c[0] for c in NORMS])
def test_norm(fn, op):
    x = _floats(*X)
    x[0, 1, :2] = 0  # order 0 counts non-zeros; negative orders see |0|^p = inf
    check_traced(fn, x, op=op)


def test_matrix_norm_of_a_2d_input_without_dims():
    check_traced(lambda x: torch.linalg.norm(x, math.inf), _floats(3, 5), op="aten::linalg_norm")


def test_matrix_norm_needing_singular_values_falls_back():
    _, report = check_traced(lambda x: torch.linalg.norm(x, 2, dim=(1, 2)), _floats(*X), engines=0, torch_blocks=1)
    assert report.blocks[0].fallback[0].op == "aten::linalg_norm"


def norm_method(x):
    return x.norm(3, 1, True)


def norm_scalar(x):
    return x.norm()


def norm_inf(x):
    return x.norm(float("inf"), [0, 2])


def norm_dim_dtype(x):
    return torch.ops.aten.norm(x, 2.0, [1], False, dtype=torch.float64)


def norm_dtype(x):
    return torch.ops.aten.norm(x, 1.0, dtype=torch.float64)


def frobenius(x):
    return torch.frobenius_norm(x, [0, 1], True)


@pytest.mark.parametrize("fn,op", [(norm_method, "aten::norm.ScalarOpt_dim"), (norm_scalar, "aten::norm.Scalar"),
                                   (norm_inf, "aten::norm.ScalarOpt_dim"),
                                   (norm_dim_dtype, "aten::norm.ScalarOpt_dim_dtype"),
                                   (norm_dtype, "aten::norm.ScalarOpt_dtype"),
                                   (frobenius, "aten::frobenius_norm.dim")])
@pytest.mark.filterwarnings("ignore:at..frobenius_norm is deprecated")
def test_norm_scripted_overloads(fn, op):
    check_fn(fn, _floats(*X), op=op)


def var_unbiased(x):
    return torch.var(x, False)


def std_unbiased(x):
    return torch.std(x, True)


def var_dim(x):
    return torch.var(x, [0, -1], True, True)


def std_dim(x):
    return torch.std(x, [1], False)


@pytest.mark.parametrize("fn,op", [(var_unbiased, "aten::var"), (std_unbiased, "aten::std"),
                                   (var_dim, "aten::var.dim"), (std_dim, "aten::std.dim")])
def test_var_std_scripted_overloads(fn, op):
    check_fn(fn, _floats(*X), op=op)


EMPTY = [  # topk(x, 0) makes an empty (3, 0) tensor inside the engine
    ("sum", lambda e: e.sum(-1)),
    ("prod", lambda e: e.prod(1)),
    ("mean", lambda e: e.mean(-1)),
    ("amax-over-non-empty-dim", lambda e: e.amax(0)),
    ("all", lambda e: e.all(1)),
    ("any", lambda e: e.any(-1, keepdim=True)),
    ("cumsum", lambda e: e.cumsum(1)),
    ("norm", lambda e: torch.linalg.vector_norm(e, dim=1)),
]


@pytest.mark.parametrize("fn", [c[1] for c in EMPTY], ids=[c[0] for c in EMPTY])
def test_reduction_over_empty_dims(fn):
    check_traced(lambda x: fn(torch.topk(x, 0)[0]), _floats(3, 4))


_SPECIAL_ROWS = torch.tensor([[float("nan"), 1.0, 2.0, -1.0], [float("inf"), -2.0, 0.0, 3.0],
                              [float("nan")] * 4, [-float("inf"), 0.0, -0.0, 5.0]])


@pytest.mark.parametrize("name, fn", [
    ("aminmax", lambda x: torch.aminmax(x)),
    ("aminmax_dim", lambda x: torch.aminmax(x, dim=1, keepdim=True)),
    ("nansum", lambda x: torch.nansum(x, 1)),
    ("nansum_all", lambda x: torch.nansum(x)),
    ("nanmean", lambda x: torch.nanmean(x, 1, keepdim=True)),  # a row of NaN gives NaN
    ("count_nonzero", lambda x: torch.count_nonzero(x, 0)),
    ("count_nonzero_dims", lambda x: torch.count_nonzero(x, [0, 1])),
    ("dist", lambda x: torch.dist(x, x.flip(0), 3)),
    ("pairwise_distance", lambda x: F.pairwise_distance(x, x.flip(1), keepdim=True)),
    ("vecdot", lambda x: torch.linalg.vecdot(x, x.flip(0), dim=0)),
    ("vdot", lambda x: torch.vdot(x[0], x[1])),
    ("matrix_norm_fro", lambda x: torch.linalg.matrix_norm(x)),
    ("matrix_norm_inf", lambda x: torch.linalg.matrix_norm(x, float("inf"))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_composed_reductions(name, fn):
    check_traced(fn, torch.randn(4, 4))
    check_traced(fn, _SPECIAL_ROWS)


@pytest.mark.parametrize("size", [[1, 4], [3, 1], [4], [1, 1], [3, 4]])
def test_sum_to_size(size):
    check_traced(lambda x: x.sum_to_size(size), torch.randn(2, 3, 4))


@pytest.mark.parametrize("p, dim", [(2, 0), (1, 1), (float("inf"), -1)])
def test_renorm(p, dim):
    x = torch.randn(3, 4, 2) * 3
    check_traced(lambda x: torch.renorm(x, p, dim, 1.5), x)
    x[0, 0, 0], x[1, 2, 1] = float("nan"), float("inf")
    check_traced(lambda x: torch.renorm(x, p, dim, 1.5), x)


@pytest.mark.parametrize("dim", [1, 0, -1])
def test_cosine_similarity(dim):
    a, b = torch.randn(4, 5), torch.randn(1, 5)
    check_traced(lambda a, b: F.cosine_similarity(a, b, dim=dim), a, b)
    a[0, 0], a[1, :] = float("nan"), 0.0  # a zero row: the norm clamped to eps
    check_traced(lambda a, b: F.cosine_similarity(a, b, dim=dim, eps=1e-3), a, b)
