"""Generated Triton kernels for reduction groups (runtime/backends/cuda/codegen/reduction.py) against the layers'
reference meanings chained: reduce (sum, mean, max, min; kept dims or not), softmax and log-softmax, layer norm over
one and two trailing dims, instance norm, RMSNorm written as pointwise layers around a mean, a residual add before
a norm, half-precision casts around it; NaN and infinities; rows kept in registers and rows reduced in passes;
strided and broadcast operands.

On a machine without CUDA the kernels run in Triton's CPU interpreter. fp32: |err| <= 1e-5 * max|ref| (the kernel's
fp32 sums differ from torch's in their order); fp16 outputs: |err| <= 2**-10 * |ref| + 2**-14 (one unit in the last
place: the kernel rounds once, at the end).
"""
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.errors import NetworkError  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.ir.reference import run_layer  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen import reduction  # noqa: E402

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # numpy on NaN and inf in the interpreter
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
F32, F16 = torch.float32, torch.float16
R = L.ReduceOperation


def reference(net: Network, values: dict[str, torch.Tensor], float64: bool = False) -> list[torch.Tensor]:
    """The layers' meanings chained, on the CPU (a float32 network's in float64 if asked: for rows far from zero,
    where torch's float32 norms lose digits)."""
    wide = (lambda t: t.double() if t.dtype == F32 else t) if float64 else (lambda t: t)
    env = {id(t): wide(values[t.name]) for t in net.inputs}
    for layer in net.layers:
        weights = {k: wide(w) for k, w in layer.weights.items()}
        outs = run_layer(layer, [env[id(t)] for t in layer.inputs], weights, torch.device("cpu"))
        env.update({id(t): o for t, o in zip(layer.outputs, outs)})
    return [env[id(t)] for t in net.outputs]


def assert_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.dtype, ref.shape)
    got, ref = got.cpu().double(), ref.cpu().double()
    assert torch.equal(got.isnan(), ref.isnan()), "NaN positions differ"
    inf = ref.isinf()
    assert torch.equal(got[inf], ref[inf])
    finite = ref.isfinite()
    if not finite.any():
        return
    err = (got[finite] - ref[finite]).abs()
    scale = ref[finite].abs().max().item()
    assert err.max().item() <= 1e-5 * scale + 1e-7, f"max error {err.max().item()} (max|ref| {scale})"


def assert_close_half(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype == F16 and got.shape == ref.shape
    got, ref = got.cpu().double(), ref.cpu().double()
    assert torch.equal(got.isnan(), ref.isnan())
    err = (got - ref).abs()
    assert bool((err <= ref.abs() * 2.0 ** -10 + 2.0 ** -14).all()), f"max error {err.max().item()}"


def check(net: Network, values: dict[str, torch.Tensor], half: bool = False) -> list[torch.Tensor]:
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    got = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    refs = reference(net, values)
    for g, r in zip(got, refs):
        (assert_close_half if half else assert_close)(g, r)
    return got


def data(*shape, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)


@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.MAX, R.MIN])
@pytest.mark.parametrize("keep", [True, False], ids=["keep", "drop"])
@pytest.mark.parametrize("axes", [(2,), (1, 2)], ids=["last", "last2"])
def test_reduce_over_trailing_axes(op, keep, axes):
    net = Network("r")
    x = net.add_input("x", F32, (3, 5, 37))
    net.mark_output(net.add_reduce(x, op, axes, keep).get_output())
    check(net, {"x": data(3, 5, 37)})


@pytest.mark.parametrize("axes", [(0,), (1,), (1, 2), (0, 3), (0, 1, 3)], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_reduce_over_any_axes(axes, layout):
    """Reductions over leading and middle axes (sum, mean, max, min; kept dims or not; one kernel): the kernel's
    space puts the reduced dims last and reads every operand through its strides in that order (no copy),
    whatever the input's layout."""
    net = Network("r")
    x = net.add_input("x", F32, (3, 6, 5, 37))
    for op, keep in ((R.SUM, True), (R.AVG, False), (R.MAX, True), (R.MIN, False)):
        net.mark_output(net.add_reduce(x, op, axes, keep).get_output())
    v = data(3, 6, 5, 37)
    check(net, {"x": v.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else v})


@pytest.mark.parametrize("passes", [False, True], ids=["registers", "passes"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
def test_global_response_norm_over_the_spatial_dims_of_channels_last_activations(monkeypatch, passes, dtype):
    """ConvNeXt V2's GRN on [N, H, W, C] activations: x * x summed over H and W (middle axes), its square root,
    and x * that, one kernel: a value per (sample, channel) row, read back as a row value by the epilogue; the
    rows interleave element by element, in registers and (rows longer than a program holds) in passes."""
    if passes:
        monkeypatch.setattr(reduction, "MAX_PERSISTENT", 16)
        monkeypatch.setattr(reduction, "LOOP_BLOCK", 16)
    E = L.ElementWiseOperation
    net = Network("grn")
    x = net.add_input("x", dtype, (2, 7, 5, 24))
    up = net.add_cast(x, F32).get_output() if dtype == F16 else x
    sq = net.add_elementwise(up, up, E.PROD).get_output()
    g = net.add_unary(net.add_reduce(sq, R.SUM, (1, 2), True).get_output(), L.UnaryOperation.SQRT).get_output()
    out = net.add_elementwise(up, g, E.PROD).get_output()
    net.mark_output(net.add_cast(out, F16).get_output() if dtype == F16 else out)
    net.mark_output(g)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    v = data(2, 7, 5, 24, dtype=dtype)
    got = launcher([v.to(DEVICE)])
    refs = reference(net, {"x": v})
    (assert_close_half if dtype == F16 else assert_close)(got[0], refs[0])
    assert_close(got[1], refs[1])
    assert list(got[1].shape) == [2, 1, 1, 24]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_sum_over_middle_axes_of_few_rows_is_reduced_in_spans(monkeypatch, layout):
    """GRN's sum of squares over the H and W of [N, H, W, C] (rows interleaving element by element) and over the
    H and W of channels-last [N, C, H, W] (likewise), with too few rows for the GPU (thresholds lowered): partial
    sums of spans, then each row's total and its square root; the values match."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "MIN_PROGRAMS", 4096)
    shape, axes = ((2, 9, 7, 12), (1, 2)) if layout == "contiguous" else ((2, 12, 9, 7), (2, 3))
    net = Network("grn")
    x = net.add_input("x", F16, shape)
    up = net.add_cast(x, F32).get_output()
    sq = net.add_elementwise(up, up, L.ElementWiseOperation.PROD).get_output()
    total = net.add_reduce(sq, R.SUM, axes, True).get_output()
    net.mark_output(net.add_unary(total, L.UnaryOperation.SQRT).get_output())
    v = data(*shape, dtype=F16)
    v = v.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else v
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    seen = []
    _split_launches(launcher, seen)
    got = launcher([v.to(DEVICE)])
    assert [name for name, _, _ in seen] == [reduction.SPLIT_STATS, reduction.SPLIT_APPLY]
    assert_close(got[0], reference(net, {"x": v})[0])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_and_scans_along_any_axis(axis):
    """softmax, log-softmax and a cumulative sum along a leading or middle axis, and the last for comparison."""
    net = Network("s")
    x = net.add_input("x", F32, (4, 9, 6))
    net.mark_output(net.add_softmax(x, axis).get_output())
    net.mark_output(net.add_softmax(x, axis, log=True).get_output())
    check(net, {"x": data(4, 9, 6)})
    net = Network("scan")
    x = net.add_input("x", F32, (4, 9, 6))
    net.mark_output(net.add_cumulative(x, L.CumulativeOperation.SUM, axis).get_output())
    check(net, {"x": data(4, 9, 6) * 0.1})


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_with_a_scale_and_mask_prologue(log):
    """scores * scale + mask -> softmax: the attention written by hand, one kernel; the mask is one value per
    column, broadcast over rows (a padding mask)."""
    net = Network("s")
    x = net.add_input("x", F32, (2, 3, 7, 40))
    mask = net.add_input("mask", F32, (2, 1, 1, 40))
    scaled = net.add_scale(x, L.ScaleMode.UNIFORM, scale=torch.tensor([0.125])).get_output()
    masked = net.add_elementwise(scaled, mask, L.ElementWiseOperation.SUM).get_output()
    net.mark_output(net.add_softmax(masked, 3, log=log).get_output())
    m = torch.zeros(2, 1, 1, 40)
    m[1, ..., 30:] = float("-inf")
    check(net, {"x": data(2, 3, 7, 40), "mask": m})


def test_softmax_of_special_values():
    """A row with NaN is NaN; a row of -inf is NaN (torch's softmax of it); +inf in a row is NaN there too."""
    net = Network("s")
    x = net.add_input("x", F32, (5, 6))
    net.mark_output(net.add_softmax(x, 1).get_output())
    v = data(5, 6)
    v[1, 2] = float("nan")
    v[2] = float("-inf")
    v[3, 0] = float("inf")
    v[4, :3] = float("-inf")
    check(net, {"x": v})


def test_max_and_min_propagate_nan():
    net = Network("r")
    x = net.add_input("x", F32, (4, 9))
    net.mark_output(net.add_reduce(x, R.MAX, (1,), False).get_output())
    net.mark_output(net.add_reduce(x, R.MIN, (1,), True).get_output())
    v = data(4, 9)
    v[0, 3] = float("nan")
    v[2, 8] = float("nan")
    v[3, 0] = float("-inf")
    got = check(net, {"x": v})
    assert got[0][0].isnan() and got[1][2, 0].isnan()


def layer_norm_net(shape, normalized, dtype=F32, residual=False):
    net = Network("ln")
    x = net.add_input("x", dtype, shape)
    h = x
    if residual:
        y = net.add_input("y", dtype, shape)
        h = net.add_elementwise(x, y, L.ElementWiseOperation.SUM).get_output()
    up = net.add_cast(h, F32).get_output() if dtype != F32 else h
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(normalized, generator=g), torch.randn(normalized, generator=g)
    norm = net.add_normalization(up, L.NormalizationKind.LAYER, 1e-5, normalized_shape=normalized,
                                 scale=w, bias=b).get_output()
    net.mark_output(net.add_cast(norm, dtype).get_output() if dtype != F32 else norm)
    if residual:
        net.mark_output(h)
    return net


@pytest.mark.parametrize("normalized", [(48,), (6, 8)], ids=["1d", "2d"])
def test_layer_norm(normalized):
    check(layer_norm_net((3, 4, *normalized), normalized), {"x": data(3, 4, *normalized)})


def test_half_layer_norm_of_a_residual_sum_writes_the_sum():
    """add -> cast up -> layer norm -> cast down (what the precision pass makes of a half-precision pre-norm
    block): the sum is an output too, rounded once as the add's output is."""
    net = layer_norm_net((4, 7, 64), (64,), F16, residual=True)
    values = {"x": data(4, 7, 64, dtype=F16), "y": data(4, 7, 64, dtype=F16, seed=1)}
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    got = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    ref = reference(net, values)
    assert_close_half(got[0], ref[0])
    assert torch.equal(got[1].cpu(), ref[1].cpu())


def test_a_row_kernel_loads_every_operand_before_its_first_reduction():
    """A layer norm's scale and shift are read at the kernel's start, not after its mean and variance, in both tile
    orientations of the kernel that keeps rows in registers; the values stay the same."""
    net = layer_norm_net((2, 5, 64), (64,), F16, residual=True)
    source = reduction.generate(net.layers, net.inputs, net.outputs).source
    for name in (reduction.KERNEL, reduction.KERNEL + reduction.TRANSPOSED):
        body = source[source.index(f"def {name}("):]
        body = body[:body.index("@triton.jit")]
        loads = [i for i, line in enumerate(body.splitlines()) if "tl.load(" in line]
        first_reduction = next(i for i, line in enumerate(body.splitlines()) if "tl.reduce(" in line)
        assert len(loads) == 4 and max(loads) < first_reduction, body
    values = {"x": data(2, 5, 64, dtype=F16), "y": data(2, 5, 64, dtype=F16, seed=1)}
    got = check(net, values, half=True)
    assert torch.equal(got[1].cpu(), (values["x"] + values["y"]))


def test_instance_norm_of_a_channels_last_input():
    net = Network("in")
    x = net.add_input("x", F32, (2, 3, 5, 6))
    g = torch.Generator().manual_seed(3)
    net.mark_output(net.add_normalization(x, L.NormalizationKind.INSTANCE, 1e-5, scale=torch.randn(3, generator=g),
                                          bias=torch.randn(3, generator=g)).get_output())
    check(net, {"x": data(2, 3, 5, 6)})
    check(net, {"x": data(2, 3, 5, 6).contiguous(memory_format=torch.channels_last)})


def group_norm_sigmoid_net(shape, groups, dtype):
    """GroupNorm (scale and shift) -> sigmoid (an output), over an input "x" of `shape`."""
    net = Network("gn")
    x = net.add_input("x", dtype, shape)
    g = torch.Generator().manual_seed(3)
    norm = net.add_normalization(x, L.NormalizationKind.GROUP, 1e-5, scale=torch.randn(shape[1], generator=g),
                                 bias=torch.randn(shape[1], generator=g), num_groups=groups).get_output()
    net.mark_output(net.add_activation(norm, L.ActivationType.SIGMOID).get_output())
    return net


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_group_norm_with_silu(channels_last):
    """GroupNorm -> SiLU (a diffusion UNet's): rows are (sample, group); a channels-last input is read along its
    channels (the reduced dims are walked in the order of its strides)."""
    net = group_norm_sigmoid_net((2, 12, 5, 6), 4, F32)
    norm = net.layers[0].outputs[0]
    net.mark_output(net.add_elementwise(norm, net.layers[-1].outputs[0], L.ElementWiseOperation.PROD).get_output())
    v = data(2, 12, 5, 6)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    xv = v.contiguous(memory_format=torch.channels_last) if channels_last else v
    got = launcher([xv.to(DEVICE)])
    for gv, rv in zip(got, reference(net, {"x": v})):
        assert_close(gv, rv)
        assert gv.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    # asked to (its readers are channels-last convolutions), it writes channels-last whatever its input's layout
    for gv, rv in zip(reduction.compile_group(net.layers, net.inputs, net.outputs, channels_last=True)(
            [xv.to(DEVICE)]), reference(net, {"x": v})):
        assert_close(gv, rv)
        assert gv.is_contiguous(memory_format=torch.channels_last)


class _Recording:
    """A kernel whose launches record their meta-parameters."""

    def __init__(self, fn, seen):
        self.fn, self.seen = fn, seen

    def __getitem__(self, grid):
        def launch(*args, **meta):
            sizes = [meta[k] for k in ("ROWS", "BLOCK", "SPLITS") if k in meta]
            assert all(n & (n - 1) == 0 for n in sizes), f"Triton's ranges must be powers of two: {meta}"
            # the kernel's name without the tile orientation (test_both_tile_orientations_compute_the_same)
            self.seen.append((self.fn.fn.__name__.removesuffix(reduction.TRANSPOSED), meta["ROWS"], meta["BLOCK"]))
            return self.fn[grid](*args, **meta)
        return launch


def _check_recorded(net, values):
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    seen = []
    _record_launches(launcher, seen)
    got = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    for g, r in zip(got, reference(net, values)):
        assert_close_half(g, r)
    return seen[0]


@pytest.mark.parametrize("passes", [False, True], ids=["rows-in-registers", "passes"])
def test_rows_tiled_across_a_channels_last_input(monkeypatch, passes):
    """Channels-last rows (a mean over the spatial dims, a group norm with SiLU) are tiled across neighbouring rows,
    whose elements share sectors; rows longer than a program keeps (`passes`) are reduced in passes with a partial
    last block, and the row count is no multiple of the rows a program takes."""
    monkeypatch.setattr(reduction, "MIN_PROGRAMS", 2)
    if passes:
        monkeypatch.setattr(reduction, "MAX_PERSISTENT", 32)
        monkeypatch.setattr(reduction, "_ACROSS_TILE", 64)
    net = Network("se")
    x = net.add_input("x", F16, (3, 40, 5, 7))
    net.mark_output(net.add_reduce(x, R.AVG, (2, 3), True).get_output())
    v = data(3, 40, 5, 7, dtype=F16).contiguous(memory_format=torch.channels_last)
    assert _check_recorded(net, {"x": v}) == (("rows_kernel_looped", 16, 16) if passes else ("rows_kernel", 16, 64))
    net = group_norm_sigmoid_net((2, 24, 5, 6), 6, F16)
    v = data(2, 24, 5, 6, dtype=F16).contiguous(memory_format=torch.channels_last)  # a group: 4 channels, 8 bytes
    # (whole rows in registers: a program takes rows up to 1024 elements while programs remain)
    assert _check_recorded(net, {"x": v}) == (("rows_kernel_looped", 4, 16) if passes else ("rows_kernel", 8, 128))


def test_rows_numbered_in_memory_order(monkeypatch):
    """A sum over the radix dim of a channels-last [N, 2C, H, W] map viewed as [N, 2, C, H, W] (split attention):
    its rows are numbered (N, H, W, C), so a program's rows are neighbouring channels; rows of 2 columns are not
    padded to 16 lanes but packed up to a tile; the output is written in the same order (channels-last), and the
    values match the reference."""
    monkeypatch.setattr(reduction, "MIN_PROGRAMS", 2)
    net = Network("radix")
    x = net.add_input("x", F16, (2, 2, 24, 5, 7))
    out = net.add_reduce(x, R.SUM, (1,), False).get_output()
    net.mark_output(out)
    v = data(2, 48, 5, 7, dtype=F16).contiguous(memory_format=torch.channels_last).view(2, 2, 24, 5, 7)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    seen = []
    _record_launches(launcher, seen)
    got = launcher([v.to(DEVICE)])[0]
    assert_close_half(got, reference(net, {"x": v})[0])
    assert seen[0] == ("rows_kernel", 512, 2)
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()


def _split_launches(launcher, seen):
    for transposed, (stats, apply) in launcher._split.items():
        launcher._split[transposed] = (_Recording(stats, seen), _Recording(apply, seen))
    if launcher._split_sub_rows is not None:
        stats, apply, merge = launcher._split_sub_rows
        launcher._split_sub_rows = (_Recording(stats, seen), _Recording(apply, seen), merge)


def _record_launches(launcher, seen):
    for kernels in (launcher._persistent, launcher._looped):
        for transposed, fn in kernels.items():
            kernels[transposed] = _Recording(fn, seen)


@pytest.mark.parametrize("case", ["group-norm-channels-last", "group-norm-3-channels-a-group", "layer-norm-few-rows",
                                  "instance-norm-channels-last"])
def test_norms_reduced_in_spans(monkeypatch, case):
    """A norm over few rows, or over rows apart in memory, is reduced in spans: partial mean and squared deviations
    of each span, merged per row, then the outputs; the last span is partial. Rows far from zero against their spread
    (mean 10, deviation 0.1) check the merge of squared deviations, where E[x^2] - E[x]^2 would lose 3 digits."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_ACROSS_TILE", 64)
    monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    g = torch.Generator().manual_seed(7)
    if case == "group-norm-channels-last":
        net = group_norm_sigmoid_net((2, 24, 5, 6), 6, F16)
        values = {"x": data(2, 24, 5, 6, dtype=F16).contiguous(memory_format=torch.channels_last)}
        # 4 channels a group (8-byte runs): a row per channel (sub-rows), 32 of them a program
        expected = ("rows_split_stats_kernel", 32, 16)
    elif case == "group-norm-3-channels-a-group":  # 6-byte runs: 3 sub-rows a group, 36 in all
        net = group_norm_sigmoid_net((2, 18, 5, 6), 6, F16)
        values = {"x": data(2, 18, 5, 6, dtype=F16).contiguous(memory_format=torch.channels_last)}
        expected = ("rows_split_stats_kernel", 32, 16)
    elif case == "layer-norm-few-rows":
        net = layer_norm_net((3, 150), (150,), F32, residual=True)
        values = {"x": torch.randn(3, 150, generator=g) * 0.1 + 10, "y": torch.randn(3, 150, generator=g) * 0.1}
        expected = ("rows_split_stats_kernel", 1, 64)
    else:
        net = Network("in")
        x = net.add_input("x", F32, (2, 3, 9, 10))
        net.mark_output(net.add_normalization(x, L.NormalizationKind.INSTANCE, 1e-5, scale=torch.randn(3, generator=g),
                                              bias=torch.randn(3, generator=g)).get_output())
        values = {"x": (data(2, 3, 9, 10) * 0.05 + 10).contiguous(memory_format=torch.channels_last)}
        expected = ("rows_split_stats_kernel", 8, 16)  # a row per channel, 4 bytes apart (along a warp)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    assert launcher.kernel.splittable
    seen = []
    _split_launches(launcher, seen)
    got = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    assert seen and seen[0] == expected and seen[1][0].startswith(expected[0].replace("stats", "apply"))
    assert seen[1][0].endswith(reduction.SUB_ROWS) == case.startswith("group-norm")  # a row per channel
    for g_, r in zip(got, reference(net, values)):
        (assert_close_half if g_.dtype == F16 else assert_close)(g_, r)


@pytest.mark.parametrize("second", ["channels-last", "contiguous", "per-channel"])
def test_a_group_norm_over_sub_rows_reads_operands_of_any_layout(monkeypatch, second):
    """A group norm of a sum over short channels-last runs, split into a row per channel: the sum's other operand
    channels-last too, contiguous (its strides unlike the first's), or one value per channel (a row operand of the
    split); fp32 rows far from zero against their spread (E[x^2] - E[x]^2 would lose 3 digits), two spans a sub-row,
    the last partial. The reference is computed in float64: torch's own float32 group norm of a channels-last CPU
    tensor is off by 1e-2 on such rows."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    shape, g = (3, 12, 5, 7), torch.Generator().manual_seed(11)
    other = (1, 12, 1, 1) if second == "per-channel" else shape
    net = Network("gn of a sum")
    x, y = net.add_input("x", F32, shape), net.add_input("y", F32, other)
    total = net.add_elementwise(x, y, L.ElementWiseOperation.SUM).get_output()
    norm = net.add_normalization(total, L.NormalizationKind.GROUP, 1e-5, scale=torch.randn(12, generator=g),
                                 bias=torch.randn(12, generator=g), num_groups=4).get_output()
    net.mark_output(net.add_activation(norm, L.ActivationType.SIGMOID).get_output())
    xv = (torch.randn(shape, generator=g) * 0.3 + 10).contiguous(memory_format=torch.channels_last)
    yv = torch.randn(other, generator=g) * 0.3
    yv = yv.contiguous(memory_format=torch.channels_last) if second == "channels-last" else yv
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    seen = []
    _split_launches(launcher, seen)
    got = launcher([xv.to(DEVICE), yv.to(DEVICE)])
    # 3 channels a group (6-byte runs): a row per channel unless an operand's group index does not continue it
    assert seen[0] == ("rows_split_stats_kernel", 32, 16) and seen[1][0] == "rows_split_apply_kernel_t_s"
    norm = net.layers[1]
    ref = torch.sigmoid(torch.nn.functional.group_norm(xv.double() + yv.double(), 4, norm.weights["scale"].double(),
                                                       norm.weights["bias"].double(), 1e-5))
    assert_close(got[0], ref.float())


def test_a_group_norm_of_an_nchw_input_written_channels_last_is_reduced_over_sub_rows(monkeypatch):
    """Written channels-last for a convolution, an NCHW input's group norm (4 channels a group) has output rows that
    interleave in 8-byte runs: it is reduced in spans over a row per channel (loads along positions, stores along
    channels), not one row a program, whose stores would scatter."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    net = group_norm_sigmoid_net((2, 24, 5, 6), 6, F16)
    v = data(2, 24, 5, 6, dtype=F16)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs, channels_last=True)
    seen = []
    _split_launches(launcher, seen)
    got = launcher([v.to(DEVICE)])[0]
    assert seen == [("rows_split_stats_kernel", 32, 16), ("rows_split_apply_kernel_t_s", 32, 16)]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert_close_half(got, reference(net, {"x": v})[0])


def group_norm_operands_net(shape, groups, dtype):
    """x * s -> GroupNorm -> sigmoid -> * r + m (cast around the norm in half precision): s one value per sample (a
    row operand), r a full input of x's shape, m of lower rank (one value per position along the last dim)."""
    net = Network("gn operands")
    x, s = net.add_input("x", dtype, shape), net.add_input("s", dtype, (shape[0],) + (1,) * (len(shape) - 1))
    r, m = net.add_input("r", F32, shape), net.add_input("m", F32, shape[-1:])
    h = net.add_elementwise(x, s, L.ElementWiseOperation.PROD).get_output()
    h = net.add_cast(h, F32).get_output() if dtype != F32 else h
    g = torch.Generator().manual_seed(3)
    norm = net.add_normalization(h, L.NormalizationKind.GROUP, 1e-5, scale=torch.randn(shape[1], generator=g),
                                 bias=torch.randn(shape[1], generator=g), num_groups=groups).get_output()
    out = net.add_activation(norm, L.ActivationType.SIGMOID).get_output()
    out = net.add_elementwise(out, r, L.ElementWiseOperation.PROD).get_output()
    out = net.add_elementwise(out, m, L.ElementWiseOperation.SUM).get_output()
    net.mark_output(net.add_cast(out, dtype).get_output() if dtype != F32 else out)
    return net


@pytest.mark.parametrize("case", ["nchw-written-channels-last", "channels-last-6-a-group", "1d-channels-inner"])
def test_a_group_norm_over_sub_rows_with_row_full_and_lower_rank_operands(monkeypatch, case):
    """The sub-row split of a group norm reading a per-sample row operand (loaded per sub-row), a full operand of
    another layout than x's and one of lower rank (both broadcast through the merged row dim): an NCHW input written
    channels-last (3 channels a group, fp32 rows far from zero, float64 reference); a channels-last fp16 input of 6
    channels a group (54 sub-rows: no multiple of a program's 32; 6 * 2 spans merged over a range of 16); a 1-d
    norm's [N, C, L] input whose channels are innermost in memory (a transposed [N, L, C] tensor)."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    shape, groups, dtype, channels_last = {"nchw-written-channels-last": ((2, 12, 5, 7), 4, F32, True),
                                           "channels-last-6-a-group": ((3, 18, 5, 6), 3, F16, False),
                                           "1d-channels-inner": ((2, 12, 40), 6, F32, False)}[case]
    net = group_norm_operands_net(shape, groups, dtype)
    g = torch.Generator().manual_seed(5)
    values = {"x": (torch.randn(shape, generator=g) * 0.3 + (10 if dtype == F32 else 1)).to(dtype),
              "s": (torch.rand((shape[0],) + (1,) * (len(shape) - 1), generator=g) + 0.5).to(dtype),
              "r": torch.randn(shape, generator=g), "m": torch.randn(shape[-1:], generator=g)}
    given = dict(values)
    if case == "channels-last-6-a-group":
        given["x"] = values["x"].contiguous(memory_format=torch.channels_last)
    elif case == "1d-channels-inner":
        given["x"] = values["x"].transpose(1, 2).contiguous().transpose(1, 2)
        given["r"] = values["r"].transpose(1, 2).contiguous().transpose(1, 2)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs, channels_last=channels_last)
    seen = []
    _split_launches(launcher, seen)
    (got,) = launcher([given[t.name].to(DEVICE) for t in net.inputs])
    assert [name for name, *_ in seen] == ["rows_split_stats_kernel", "rows_split_apply_kernel_t_s"]
    assert got.is_contiguous(memory_format=torch.channels_last) == (len(shape) == 4)
    if dtype == F32:
        assert_close(got, reference(net, values, float64=True)[0].float())
    else:
        assert_close_half(got, reference(net, values)[0])


@pytest.mark.parametrize("shape, groups", [((2, 6, 9, 7), 6), ((2, 8, 1, 37), 4), ((2, 8, 37, 1), 4)],
                         ids=["a-channel-a-group", "h-1", "w-1"])
def test_a_group_norm_written_channels_last_with_dims_of_one(monkeypatch, shape, groups):
    """An NCHW input's group norm written channels-last, one channel a group (an instance norm: no dim of one is
    split off into sub-rows) or an H or W of 1 (a dim of one, whose strides are any), against float64."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    net = group_norm_sigmoid_net(shape, groups, F32)
    v = torch.randn(shape, generator=torch.Generator().manual_seed(2)) * 0.3 + 10
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs, channels_last=True)
    seen = []
    _split_launches(launcher, seen)
    (got,) = launcher([v.to(DEVICE)])
    assert seen[0][0] == "rows_split_stats_kernel"
    assert seen[-1][0].endswith(reduction.SUB_ROWS) == (groups < shape[1])
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert_close(got, reference(net, {"x": v}, float64=True)[0].float())


def test_groups_with_other_reductions_or_full_outputs_of_a_sum_are_not_split():
    net = Network("softmax")
    x = net.add_input("x", F32, (2, 64))
    net.mark_output(net.add_softmax(x, 1).get_output())
    assert not reduction.generate(net.layers, net.inputs, net.outputs).splittable
    net = Network("centered")
    x = net.add_input("x", F32, (2, 64))
    mean = net.add_reduce(x, R.AVG, (1,), True).get_output()
    net.mark_output(net.add_elementwise(x, mean, L.ElementWiseOperation.SUB).get_output())
    assert not reduction.generate(net.layers, net.inputs, net.outputs).splittable


@pytest.mark.parametrize("layout", ["channels-last", "contiguous-few-rows"])
def test_a_sum_of_long_rows_over_few_programs_is_reduced_in_spans(monkeypatch, layout):
    """A mean over the spatial dims (then a row epilogue: sigmoid of mean * w) whose launch would leave few programs:
    each span's partial sum (the prologue's exp in it), then one program per row block sums a row's spans and
    computes its row values. The last span is partial."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_ACROSS_TILE", 64)
    shape = (2, 40, 5, 7) if layout == "channels-last" else (1, 3, 9, 10)
    net = Network("squeeze")
    x = net.add_input("x", F16, shape)
    e = net.add_unary(x, L.UnaryOperation.EXP).get_output()
    mean = net.add_reduce(e, R.AVG, (2, 3), True).get_output()
    w = net.add_constant(torch.randn(1, shape[1], 1, 1).half()).get_output()
    net.mark_output(net.add_activation(net.add_elementwise(mean, w, L.ElementWiseOperation.PROD).get_output(),
                                       L.ActivationType.SIGMOID).get_output())
    v = data(*shape, dtype=F16)
    values = {"x": v.contiguous(memory_format=torch.channels_last) if layout == "channels-last" else v}
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    assert launcher.kernel.split_sum
    seen = []
    _split_launches(launcher, seen)
    (got,) = launcher([values[t.name].to(DEVICE) for t in net.inputs])
    assert [name for name, *_ in seen] == ["rows_split_stats_kernel", "rows_split_apply_kernel"]
    assert_close_half(got, reference(net, values)[0])


def test_rows_of_a_contiguous_input_are_not_tiled_across():
    net = Network("mean")
    x = net.add_input("x", F16, (3, 40, 5, 7))
    net.mark_output(net.add_reduce(x, R.AVG, (2, 3), True).get_output())
    assert _check_recorded(net, {"x": data(3, 40, 5, 7, dtype=F16)}) == ("rows_kernel", 1, 64)  # a row at a time
    v = data(3, 40, 5, 7, dtype=F16).contiguous(memory_format=torch.channels_last)
    assert reduction._rows_filling(32, reduction._interleaved_run([list(v.stride())], list(v.shape), 2, [v])) == 16
    c = data(3, 40, 5, 7, dtype=F16)
    assert reduction._rows_filling(32, reduction._interleaved_run([list(c.stride())], list(c.shape), 2, [c])) == 1


def rms_norm_net(shape, dtype=F32):
    """x * rsqrt(mean(x^2) + eps) * w, as the layers a converter makes of RMSNorm written in PyTorch."""
    net = Network("rms")
    x = net.add_input("x", dtype, shape)
    h = net.add_cast(x, F32).get_output() if dtype != F32 else x
    sq = net.add_elementwise(h, h, L.ElementWiseOperation.PROD).get_output()
    mean = net.add_reduce(sq, R.AVG, (len(shape) - 1,), True).get_output()
    eps = net.add_constant(torch.tensor(1e-6)).get_output()
    inv = net.add_unary(net.add_elementwise(mean, eps, L.ElementWiseOperation.SUM).get_output(),
                        L.UnaryOperation.SQRT).get_output()
    normed = net.add_elementwise(h, inv, L.ElementWiseOperation.DIV).get_output()
    w = net.add_constant(torch.randn(shape[-1], generator=torch.Generator().manual_seed(5))).get_output()
    out = net.add_elementwise(normed, w, L.ElementWiseOperation.PROD).get_output()
    net.mark_output(net.add_cast(out, dtype).get_output() if dtype != F32 else out)
    return net


def test_rms_norm_from_pointwise_layers():
    check(rms_norm_net((3, 5, 64)), {"x": data(3, 5, 64)})


def test_half_rms_norm():
    check(rms_norm_net((2, 9, 96), F16), {"x": data(2, 9, 96, dtype=F16)}, half=True)


def test_long_rows_are_reduced_in_passes(monkeypatch):
    """Rows longer than a program keeps in registers: one pass per reduction depth, then the stores (a softmax
    and a layer norm, each of depth 2), with a partial last block."""
    monkeypatch.setattr(reduction, "MAX_PERSISTENT", 64)
    monkeypatch.setattr(reduction, "LOOP_BLOCK", 32)
    net = Network("long")
    x = net.add_input("x", F32, (3, 150))
    s = net.add_softmax(x, 1).get_output()
    net.mark_output(s)
    g = torch.Generator().manual_seed(3)
    net.mark_output(net.add_normalization(x, L.NormalizationKind.LAYER, 1e-5, normalized_shape=(150,),
                                          scale=torch.randn(150, generator=g)).get_output())
    net.mark_output(net.add_reduce(x, R.MAX, (1,), False).get_output())
    check(net, {"x": data(3, 150)})


def test_strided_and_broadcast_operands():
    """A transposed input, a per-row operand and a per-column weight, one compiled kernel for two shapes."""
    net = Network("b")
    x = net.add_input("x", F32, (4, 6, 20))
    r = net.add_input("r", F32, (4, 6, 1))
    shifted = net.add_elementwise(x, r, L.ElementWiseOperation.SUB).get_output()
    net.mark_output(net.add_softmax(shifted, 2).get_output())
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    xt = data(4, 20, 6).transpose(1, 2)
    for xv, rv in ((xt, data(4, 6, 1, seed=2)), (data(4, 6, 20, seed=3), data(4, 6, 1, seed=4))):
        got = launcher([xv.to(DEVICE), rv.to(DEVICE)])
        assert_close(got[0], reference(net, {"x": xv, "r": rv})[0])


def test_refusals_name_the_layer():
    net = Network("bad")
    x = net.add_input("x", F32, (4, 6))
    net.mark_output(net.add_reduce(x, R.SUM, (1,), True).get_output())
    net.mark_output(net.add_reduce(x, R.SUM, (0,), True).get_output())
    with pytest.raises(NetworkError, match=r"does not reduce the group's axes \[1\]"):
        reduction.generate(net.layers, net.inputs, net.outputs)
    net = Network("drop")
    x = net.add_input("x", F32, (4, 6))
    s = net.add_reduce(x, R.SUM, (1,), False).get_output()
    net.mark_output(net.add_unary(s, L.UnaryOperation.EXP).get_output())
    with pytest.raises(NetworkError, match="reduced without their kept dims"):
        reduction.generate(net.layers, net.inputs, net.outputs)


@pytest.mark.parametrize("per_group", [1, 2, 3, 5, 10])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=str)
def test_every_launch_takes_power_of_two_tiles(monkeypatch, per_group, channels_last, dtype):
    """Group norms of every group width, both layouts, through whichever path the launcher takes (rows, across,
    spans: thresholds lowered so small shapes reach them all): each launch's tile sizes are powers of two, as
    Triton's compiler requires (its interpreter does not check), and the values match."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "MIN_PROGRAMS", 8)
    shape = (8, 4 * per_group, 3, 5)
    net = group_norm_sigmoid_net(shape, 4, dtype)
    v = data(*shape, dtype=dtype)
    v = v.contiguous(memory_format=torch.channels_last) if channels_last else v
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    seen = []
    _record_launches(launcher, seen)
    _split_launches(launcher, seen)
    got = launcher([v.to(DEVICE)])
    assert seen
    for g_, r in zip(got, reference(net, {"x": v})):
        (assert_close_half if dtype == F16 else assert_close)(g_, r)


def _exact(got: list[torch.Tensor], refs: list[torch.Tensor]) -> None:
    for g, r in zip(got, refs):
        assert g.dtype == r.dtype and torch.equal(g.cpu(), r.cpu()), (g, r)


@pytest.mark.parametrize("passes", [False, True], ids=["registers", "passes"])
def test_scans_along_rows_with_their_prologue_and_epilogue(monkeypatch, passes):
    """cumsum of an int32 mask (int64 result, as torch.cumsum gives) times the mask, an int64 cumsum past the int64
    limit (wraps), an int32 cumprod (wraps) and float cumsum and cumprod, with a sum of the float scan: one kernel,
    the integers exact; in registers, and in passes over rows longer than a program holds (each pass carries the
    running total of the blocks before)."""
    if passes:
        monkeypatch.setattr(reduction, "MAX_PERSISTENT", 64)
        monkeypatch.setattr(reduction, "LOOP_BLOCK", 32)
    E = L.ElementWiseOperation
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 4, (3, 150), generator=g)
    big = torch.full((3, 150), 2**62, dtype=torch.int64) * torch.randint(-1, 2, (3, 150), generator=g)
    small = torch.randint(-3, 4, (3, 150), generator=g, dtype=torch.int32)
    net = Network("scan")
    x, b, s = (net.add_input(n, v.dtype, v.shape) for n, v in (("ids", ids), ("big", big), ("small", small)))
    f = net.add_input("f", F32, (3, 150))
    mask = net.add_cast(net.add_elementwise(x, net.add_constant(torch.tensor(1)).get_output(), E.NOT_EQUAL)
                        .get_output(), torch.int32).get_output()
    total = net.add_cumulative(mask, L.CumulativeOperation.SUM, 1).get_output()
    net.mark_output(net.add_elementwise(total, mask, E.PROD).get_output())
    net.mark_output(net.add_cumulative(b, L.CumulativeOperation.SUM, -1).get_output())
    net.mark_output(net.add_cumulative(s, L.CumulativeOperation.PROD, 1).get_output())
    values = {"ids": ids, "big": big, "small": small, "f": data(3, 150) * 0.01 + 1.0}
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    _exact(launcher([values[t.name].to(DEVICE) for t in net.inputs]), reference(net, values))
    net = Network("float scan")
    f = net.add_input("f", F32, (3, 150))
    scanned = net.add_cumulative(f, L.CumulativeOperation.SUM, 1).get_output()
    net.mark_output(scanned)
    net.mark_output(net.add_cumulative(f, L.CumulativeOperation.PROD, 1).get_output())
    net.mark_output(net.add_reduce(scanned, R.SUM, (1,), True).get_output())
    check(net, {"f": values["f"]})


def test_scans_the_generator_does_not_compute_are_refused():
    """A scan of float64 values stays on ATen."""
    net = Network("scan")
    x = net.add_input("x", torch.int32, (4, 6))
    wide = net.add_cumulative(net.add_cast(x, torch.float64).get_output(), L.CumulativeOperation.SUM, 1)
    assert "float64" in reduction.reduction_fusable(wide)
    assert reduction.reduction_fusable(net.add_cumulative(x, L.CumulativeOperation.SUM, 1)) is None


def test_a_programs_rows_lie_along_the_second_axis_where_it_holds_one_or_their_runs_are_long():
    assert reduction._transposed(1, None) and reduction._transposed(1, 8)  # one row a program
    assert reduction._transposed(4, 20)  # a group of 10 fp16 channels, channels-last
    assert not reduction._transposed(16, 8) and not reduction._transposed(16, 2) and not reduction._transposed(4, None)


@pytest.mark.parametrize("case", ["group-norm-nchw", "group-norm-channels-last", "mean-channels-last", "softmax"])
def test_both_tile_orientations_compute_the_same(monkeypatch, case):
    """Every kernel exists with the rows along the tile's first axis and along its second; the launcher picks one
    (`_transposed`). Each is run here, in registers and in spans, against the reference meaning."""
    if case == "group-norm-nchw":
        net, v = group_norm_sigmoid_net((2, 24, 5, 6), 6, F16), data(2, 24, 5, 6, dtype=F16)
    elif case == "group-norm-channels-last":
        net = group_norm_sigmoid_net((2, 40, 5, 6), 4, F16)
        v = data(2, 40, 5, 6, dtype=F16).contiguous(memory_format=torch.channels_last)
    elif case == "mean-channels-last":
        net = Network("mean")
        x = net.add_input("x", F16, (3, 40, 5, 7))
        net.mark_output(net.add_reduce(x, R.AVG, (2, 3), True).get_output())
        v = data(3, 40, 5, 7, dtype=F16).contiguous(memory_format=torch.channels_last)
    else:
        net = Network("softmax")
        x = net.add_input("x", F32, (6, 200))
        net.mark_output(net.add_softmax(x, 1).get_output())
        v = data(6, 200)
    ref = reference(net, {"x": v})
    for split in (False, True):
        monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16 if split else 1 << 30)
        monkeypatch.setattr(reduction, "MIN_PROGRAMS", 1 << 20 if split else 2)
        for transposed in (False, True):
            launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
            for kernels in (launcher._persistent, launcher._looped, launcher._split):
                kernels[not transposed] = kernels[transposed]  # every launch in this orientation
            for g_, r in zip(launcher([v.to(DEVICE)]), ref):
                (assert_close_half if g_.dtype == F16 else assert_close)(g_, r)


def test_a_static_space_has_constant_sizes_but_a_dynamic_one_does_not():
    """Sizes known at build are compile-time constants (Triton proves the runs it may load as vectors), except in the
    split kernels that tile short interleaved runs across columns; a dynamic dim keeps every size a runtime value
    (one compile for every shape). Both kinds compute the same."""
    from torchkiln.ir.symbolic import DimSymbol

    static = group_norm_sigmoid_net((2, 24, 5, 6), 6, F16)
    source = reduction.generate(static.layers, static.inputs, static.outputs).source
    persistent = source[source.index(f"def {reduction.KERNEL}("):]
    persistent = persistent[:persistent.index("):")]
    for size in ("rows", "cols", "s0", "s4", "in0_t0", "in0_t4", "out0_t3"):  # row and column counts, strides too
        assert f"{size}: tl.constexpr" in persistent
    split = source[source.index(f"def {reduction.SPLIT_STATS}(") + 1:]
    assert "s0: tl.constexpr" not in split[:split.index("):")]  # the first orientation's split kernel
    assert "in0_t0: tl.constexpr" not in split[:split.index("):")]
    assert reduction.constant_sizes(True, reduction.SPLIT_APPLY + reduction.TRANSPOSED)
    assert not reduction.constant_sizes(True, reduction.SPLIT_APPLY)
    assert reduction.constant_sizes(True, reduction.KERNEL) and not reduction.constant_sizes(False, reduction.KERNEL)

    net = Network("dynamic softmax")
    x = net.add_input("x", F32, (DimSymbol("batch", 1, 64), 200))
    net.mark_output(net.add_softmax(x, 1).get_output())
    source = reduction.generate(net.layers, net.inputs, net.outputs).source
    assert "tl.constexpr" in source and "s0: tl.constexpr" not in source and "s1: tl.constexpr" not in source
    assert "cols: tl.constexpr" not in source and "in0_t0: tl.constexpr" not in source
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    for rows in (3, 7):
        v = data(rows, 200)
        assert_close(launcher([v.to(DEVICE)])[0], torch.softmax(v, 1))


def test_static_spaces_of_other_shapes_share_a_kernel_that_specializes_by_their_sizes(monkeypatch):
    """Two static group norms of other shapes (and their sub-row launches, whose sizes are the merged space's) make
    one source, so one loaded module's kernels serve both: their constant sizes are values Triton compiles a kernel
    for each of, not part of the source. Each computes its own shape's answer, run one after the other twice."""
    monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
    monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    nets = [group_norm_sigmoid_net(shape, 4, F16) for shape in ((2, 12, 5, 6), (3, 12, 7, 4))]
    launchers = [reduction.compile_group(n.layers, n.inputs, n.outputs, channels_last=True) for n in nets]
    assert launchers[0].kernel.source == launchers[1].kernel.source
    assert launchers[0]._split_sub_rows[1] is launchers[1]._split_sub_rows[1]
    values = [data(*n.inputs[0].shape, dtype=F16, seed=k) for k, n in enumerate(nets)]
    for _ in range(2):
        for net, launcher, v in zip(nets, launchers, values):
            assert_close_half(launcher([v.to(DEVICE)])[0], reference(net, {"x": v})[0])


@pytest.mark.parametrize("split", [False, True], ids=["rows-in-registers", "sub-rows"])
def test_column_offsets_past_int32_are_computed_in_int64(monkeypatch, split):
    """A group norm whose rows' column offsets reach 2**31 while every stride stays below it (a sample of 2**31
    elements read channels-last has such rows): the columns are indexed in int64 too, not only the rows (int32
    column offsets wrapped: a read 4 GiB before the tensor). Its input is a view of 2**31 fp16 elements whose H
    stride is 2**30 + 64; only the few pages it names are touched."""
    if split:
        monkeypatch.setattr(reduction, "SPLIT_MIN_COLS", 16)
        monkeypatch.setattr(reduction, "_SHORT_RUN_TILE", 64)
    shape, step = (1, 4, 3, 5), (1 << 30) + 64
    net = Network("gn")
    x = net.add_input("x", F16, shape)
    g = torch.Generator().manual_seed(3)
    net.mark_output(net.add_normalization(x, L.NormalizationKind.GROUP, 1e-5, scale=torch.randn(4, generator=g),
                                          bias=torch.randn(4, generator=g), num_groups=2).get_output())
    v = data(*shape, dtype=F16)
    big = torch.empty(2 * step + 64, dtype=F16, device=DEVICE).as_strided(shape, (0, 1, step, 8))
    big.copy_(v)
    launcher = reduction.compile_group(net.layers, net.inputs, net.outputs)
    seen = []
    _split_launches(launcher, seen)
    (got,) = launcher([big])
    assert [name for name, *_ in seen] == (["rows_split_stats_kernel", "rows_split_apply_kernel_t_s"] if split else [])
    assert_close_half(got, reference(net, {"x": v})[0])


def test_a_launch_too_small_to_fill_the_gpu_gives_its_programs_more_warps():
    """Rows of 768 at batch 1 (128 programs on 132 multiprocessors): 8 warps a program, 4 elements a thread; the
    same tile over many rows keeps 2, and so does any launch off a GPU (no multiprocessors to fill)."""
    assert reduction._num_warps(1024, programs=128, sms=132) == 8
    assert reduction._num_warps(1024, programs=4096, sms=132) == 2
    assert reduction._num_warps(256, programs=16, sms=132) == 2
    assert reduction._num_warps(1024, programs=16, sms=0) == 2
