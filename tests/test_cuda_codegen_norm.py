"""The generated Triton row norm (runtime/backends/cuda/codegen/norm.py) against torch's layer norm of the same
rounded inputs: layer_norm(a [+ b]) with and without weight and bias, the sum written, odd row lengths, strided
rows, several normalized dims.

On a machine without CUDA the kernel runs in Triton's CPU interpreter. The reference is what the layers mean: the
sum rounded to the inputs' dtype, the layer norm in fp32, rounded once to the output dtype. fp32: |err| <=
1e-5 * max|ref| (seen: 2e-7). Half types: at most one unit in the last place of the result (the kernel's fp32
statistics differ from torch's in the last fp32 bits, which can move a value across a rounding boundary).
"""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import EngineInputError, NetworkError  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.norm import MAX_SIZE, RowNorm  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
MANTISSA_BITS = {F16: 10, BF16: 7}


def reference(a, b, shape, weight, bias, eps, out_dtype):
    x = a if b is None else a + b  # rounded to the inputs' dtype, as the add layer's output is
    w = None if weight is None else weight.float()
    bb = None if bias is None else bias.float()
    return F.layer_norm(x.float(), shape, w, bb, eps).to(out_dtype)


def assert_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    bits = MANTISSA_BITS.get(ref.dtype)
    got, ref = got.cpu().double(), ref.cpu().double()
    err = (got - ref).abs()
    if bits is None:
        bound = torch.full_like(ref, 1e-5 * ref.abs().max().item())
    else:  # one unit in the last place (subnormals: the smallest step)
        bound = torch.maximum(ref.abs() * 2.0 ** -bits, torch.full_like(ref, 2.0 ** -24))
    assert bool(got.isfinite().all()) and bool((err <= bound).all()), \
        f"max error {err.max().item()} (max|ref| {ref.abs().max().item()})"


def inputs(dtype, full, add, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(full, generator=g) * 3 + 1).to(dtype)
    b = torch.randn(full, generator=g).to(dtype) if add else None
    return a, b


def check(dtype, rows, shape, add=False, write_sum=False, weight=True, bias=True, out_dtype=None, eps=1e-5,
          a=None, b=None):
    out_dtype = out_dtype or dtype
    if a is None:
        a, b = inputs(dtype, (*rows, *shape), add)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=g) if weight else None
    bb = torch.randn(shape, generator=g) if bias else None
    run = RowNorm(shape, eps, None if w is None else w.to(DEVICE), None if bb is None else bb.to(DEVICE), out_dtype,
                  add=add, write_sum=write_sum)
    got = run(a.to(DEVICE), None if b is None else b.to(DEVICE))
    assert len(got) == (2 if write_sum else 1)
    if write_sum:
        assert got[1].dtype == a.dtype and torch.equal(got[1].cpu(), a + b)  # the add's sum: rounded once
    assert_close(got[0], reference(a, b, shape, w, bb, eps, out_dtype))
    return got


@pytest.mark.parametrize("size", [768, 1000, 33])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("add, write_sum", [(False, False), (True, False), (True, True)],
                         ids=["norm", "add", "add_sum"])
def test_layer_norm_of_a_sum_matches_torch(dtype, size, add, write_sum):
    check(dtype, (1,) if size > 100 else (2, 3), (size,), add, write_sum)  # the interpreter's time: elements


def test_rows_of_several_programs():
    """3 rows of 768 (blocks of 1024, 2 rows a program): the second program's second row is masked."""
    check(F16, (3,), (768,), add=True, write_sum=True)


@pytest.mark.parametrize("weight, bias", [(False, False), (True, False), (False, True)],
                         ids=["plain", "weight", "bias"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_weight_and_bias_are_optional(dtype, weight, bias):
    check(dtype, (5,), (100,), add=True, weight=weight, bias=bias)


def test_a_half_input_with_an_fp32_result():
    check(F16, (4,), (96,), add=True, out_dtype=F32)  # cast up -> layer norm, no cast back


@pytest.mark.skipif(not CUDA, reason="Triton's interpreter truncates fp32 to bfloat16 where the GPU rounds to nearest")
def test_bfloat16():
    check(BF16, (4,), (96,), add=True, write_sum=True)


def test_the_sum_is_rounded_before_the_statistics():
    """a = 1024 + k in fp16 (spacing 1 there), b in [0, 0.5): a + b rounds back to a. Statistics of the unrounded
    sum would move every value by up to 0.5 / std."""
    a = (1024 + torch.arange(64.0).remainder(4)).half().reshape(2, 32)
    b = (torch.rand(2, 32, generator=torch.Generator().manual_seed(3)) * 0.45).half()
    assert torch.equal(a + b, a)
    check(F16, None, (32,), add=True, weight=False, bias=False, a=a, b=b)


def test_short_rows_pack_into_programs_and_every_row_is_written():
    """7 rows of 5 (one program holds 512 rows of a block of 8): masked rows and columns."""
    check(F32, (7,), (5,), add=True, write_sum=True)
    check(F32, (1,), (1,))  # one element per row: the bias alone


def test_several_normalized_dims_and_strided_rows():
    check(F32, (3,), (3, 11), add=True)
    wide = torch.randn(2, 4, 96)
    view = wide[..., 16:80]  # rows of 64 at a row stride of 96: read in place
    got = RowNorm((64,), 1e-6, None, None, F32)(view.to(DEVICE))
    assert_close(got[0], F.layer_norm(view, (64,), eps=1e-6))
    tr = torch.randn(64, 6).t()  # unit stride across rows: copied to rows first
    assert_close(RowNorm((64,), 1e-5, None, None, F32)(tr.to(DEVICE))[0], F.layer_norm(tr, (64,)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf - inf in the interpreter
def test_special_values():
    """A row with an inf or a NaN is all NaN, as torch's; a constant row is the bias."""
    a = torch.randn(4, 40)
    a[0, 3], a[1, 7], a[2] = float("inf"), float("nan"), 2.5
    got = RowNorm((40,), 1e-5, None, torch.ones(40).to(DEVICE), F32)(a.to(DEVICE))[0].cpu()
    ref = F.layer_norm(a, (40,), None, torch.ones(40))
    assert torch.equal(got.isnan(), ref.isnan()) and bool(got[:2].isnan().all())
    assert_close(got[2:], ref[2:])


def test_bad_inputs_and_parameters_are_named():
    run = RowNorm((16,), 1e-5, None, None, F32, add=True)
    with pytest.raises(EngineInputError, match="normalized shape"):
        run(torch.randn(2, 8).to(DEVICE), torch.randn(2, 8).to(DEVICE))
    with pytest.raises(EngineInputError, match="one shape and dtype"):
        run(torch.randn(2, 16).to(DEVICE), torch.randn(2, 16).half().to(DEVICE))
    with pytest.raises(EngineInputError, match="takes 2 inputs"):
        run(torch.randn(2, 16).to(DEVICE))
    with pytest.raises(EngineInputError, match="dtype torch.int64"):
        RowNorm((16,), 1e-5, None, None, F32)(torch.ones(2, 16, dtype=torch.int64).to(DEVICE))
    with pytest.raises(NetworkError, match="elements per row"):
        RowNorm((MAX_SIZE + 1,), 1e-5, None, None, F32)
    with pytest.raises(NetworkError, match="weight of shape"):
        RowNorm((16,), 1e-5, torch.ones(15), None, F32)
    with pytest.raises(NetworkError, match="no sum to write"):
        RowNorm((16,), 1e-5, None, None, F32, write_sum=True)
    assert RowNorm((16,), 1e-5, None, None, F32)(torch.empty(0, 16).to(DEVICE))[0].shape == (0, 16)
