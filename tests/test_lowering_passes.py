"""Each lowering pass on a real TorchScript graph: the pattern before, the replacement after, eager's output."""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

import pytest
import torch
import torch.nn.functional as F
from harness import assert_matches_eager, check_compiled
from torch import nn

from torchkiln.lowering import LoweredModule, lower
from torchkiln.lowering import walk as walk_module
from torchkiln.lowering.passes import unroll_loops as unroll_module
from torchkiln.lowering.registry import PASSES, LoweringContext
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import argument_names


def lower_only(model: nn.Module, example: tuple, *passes: str, trace: bool = False, **options
               ) -> tuple[str, LoweredModule]:
    """Script (or trace) `model`, freeze it, run only `passes`: the frozen graph's text and the lowered module."""
    model = model.eval()
    script = torch.jit.trace(model, example) if trace else torch.jit.script(model)
    settings = CompileSettings.create(list(example), **options)
    before = str(lower(script, settings, passes=()).graph)
    return before, lower(script, settings, passes=passes)


def check_pass(model: nn.Module, example: tuple, passes: str | tuple[str, ...], gone: tuple[str, ...] = (),
               present: tuple[str, ...] = (), kept: tuple[str, ...] = (), **options) -> LoweredModule:
    """`gone` is in the frozen graph and not after the passes, `present` appears, `kept` stays; output as eager's."""
    passes = (passes,) if isinstance(passes, str) else passes
    before, lowered = lower_only(model, example, *passes, **options)
    after = str(lowered.graph)
    for op in gone + kept:
        assert op in before, f"the frozen graph does not show {op}:\n{before}"
    for op in gone:
        assert op not in after, f"{op} is still there after {passes}:\n{after}"
    for op in present + kept:
        assert op in after, f"{op} is missing after {passes}:\n{after}"
    assert passes[-1] in lowered.fired, f"{passes[-1]} reported no change:\n{after}"
    with torch.no_grad():
        assert_matches_eager(lowered.module(*example), model.eval()(*example))
    return lowered


class Fn(nn.Module):
    """forward(*xs) = fn(*xs), scripted with the module."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor):
        return self.fn(x)


def _x(*shape: int) -> tuple[torch.Tensor]:
    return (torch.randn(*shape),)


# ---- structure -------------------------------------------------------------------------------

class TupleIf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            pair = (x + 1, x * 2)
        else:
            pair = (x * 3, x - 1)
        first, second = pair
        return first * second


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_lower_tuples_splits_tuple_outputs_of_if(sign):
    check_pass(TupleIf(), (sign * torch.rand(3, 4),), "lower_tuples",
               gone=("(Tensor, Tensor) = prim::If", "prim::TupleUnpack"))


class NestedTupleIfs(nn.Module):
    """Tuples out of nested Ifs (an inner one makes its outer one flattenable), siblings, and two tuple outputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            if bool(x.mean() > 0.5):
                pair = (x + 1, x * 2)
            else:
                pair = (x * 3, x - 1)
            other = (x, x + 2)
        else:
            pair = (x * 5, x + 4)
            if bool(x.max() > 0):
                other = (x - 2, x * 4)
            else:
                other = (x + 3, x)
        if bool(x.min() < 0):
            third = (x.sin(), x.cos())
        else:
            third = (x.cos(), x.sin())
        a, b = pair
        c, d = other
        e, f = third
        return a * b + c * d + e * f


def _lower_tuples_by_fresh_walks(graph) -> None:
    """The reference: flatten the first flattenable If of a walk of the whole graph, until none is left."""
    from torchkiln.lowering.passes.lower_tuples import _flatten_if_output
    from torchkiln.lowering.walk import all_nodes

    while any(_flatten_if_output(graph, n) for n in all_nodes(graph.block()) if n.kind() == "prim::If"):
        pass


def test_lower_tuples_flattens_as_fresh_walks_would():
    """Resuming the search at the outermost If around the last one flattened gives the same graph, node for node
    and name for name, as searching the whole graph again after each one."""
    from torchkiln.lowering.passes.lower_tuples import _flatten_if_outputs

    scripted = torch.jit.script(NestedTupleIfs()).forward.graph
    graph, expected = scripted.copy(), scripted.copy()
    _lower_tuples_by_fresh_walks(expected)
    assert _flatten_if_outputs(graph)
    assert str(graph) == str(expected)
    assert "(Tensor, Tensor) = prim::If" not in str(graph)


class ListAndInplace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts: List[torch.Tensor] = []
        parts.append(x + 1)
        parts.append(x * 2)
        y = torch.cat(parts, 0)
        y.mul_(3)
        return y


def test_remove_mutation_makes_lists_literal_and_ops_functional():
    check_pass(ListAndInplace(), _x(2, 3), "remove_mutation", gone=("aten::append(", "aten::mul_("),
               present=("aten::mul(",))


class DenseLayer(nn.Module):
    """timm's DenseNet layer: `x` typed as a tensor or a list of them, concatenated once it is a list."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 2, 3, padding=1)

    def forward(self, x: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            features = [x]
        else:
            features = x
        return self.conv(torch.relu(torch.cat(features, 1)))


class DenseBlock(nn.Module):
    """Layers that each read every earlier output, kept in a list the block appends to."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DenseLayer(3 + 2 * i) for i in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1) + self.layers[0](x).sum(1, keepdim=True)  # a tensor given: the other branch


def test_fold_isinstance_by_type_decides_checks_on_concrete_types():
    """A list is no tensor and a tensor is one: both checks and their Ifs fold, the appends then functionalize."""
    lowered = check_pass(DenseBlock(), _x(2, 3, 8, 8), "fold_isinstance_by_type",
                         gone=("prim::isinstance",))
    assert "prim::If" not in str(lowered.graph)


class OptionalCheck(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: Optional[torch.Tensor] = None
        if bool(x.sum() > 0):
            y = x.exp()
        if isinstance(y, torch.Tensor):
            return x + y
        return x * 2


def test_fold_isinstance_by_type_leaves_an_optional_to_the_evaluator():
    """Optional[Tensor] may be either: its type does not decide (the value, known at build, does later)."""
    _, lowered = lower_only(OptionalCheck(), _x(2, 3), "fold_isinstance_by_type")
    assert "prim::isinstance" in str(lowered.graph) and "fold_isinstance_by_type" not in lowered.fired


def test_a_dense_block_of_union_typed_layers_is_one_engine():
    check_compiled(DenseBlock(), _x(2, 3, 8, 8), engines=1)


class MaskMadeOnTheHost(nn.Module):
    """EdgeNeXt's position encoding: a mask filled on the CPU and moved to the weights' device by its one reader."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = torch.device(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = ~torch.zeros(x.shape).to(device=self.device, dtype=torch.bool)
        return x * mask.cumsum(1, dtype=torch.float32)


def _fill_device(lowered: LoweredModule):
    (zeros,) = [n for n in lowered.graph.nodes() if n.kind() == "aten::zeros"]
    return zeros.inputsAt(argument_names(zeros).index("device")).toIValue()


def test_create_on_target_device_fills_on_the_device_it_is_moved_to():
    """Lowered only (this machine may have no GPU): the fill is made on cuda, where its reader moved it."""
    _, lowered = lower_only(MaskMadeOnTheHost("cuda"), _x(2, 3), "create_on_target_device")
    assert "create_on_target_device" in lowered.fired and _fill_device(lowered) == torch.device("cuda")


class PinnedMask(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape, pin_memory=False).to(device=torch.device("cuda"), dtype=torch.bool)
        pinned = torch.ones(x.shape, pin_memory=True).to(device=torch.device("cuda"), non_blocking=True)
        return mask.cumsum(1, dtype=torch.float32) + pinned


def test_create_on_target_device_leaves_a_pinned_fill_on_the_host():
    """CUDA refuses to make a pinned tensor: only the unpinned fill moves to the device it is read on."""
    script = torch.jit.script(PinnedMask().eval())
    lowered = lower(script, CompileSettings.create([torch.randn(2, 3)]), passes=["create_on_target_device"])
    fills = {n.kind(): n.inputsAt(argument_names(n).index("device")).toIValue() for n in lowered.graph.nodes()
             if n.kind() in ("aten::zeros", "aten::ones")}
    assert fills == {"aten::zeros": torch.device("cuda"), "aten::ones": None}


def test_create_on_target_device_leaves_a_fill_moved_to_the_cpu():
    _, lowered = lower_only(MaskMadeOnTheHost("cpu"), _x(2, 3), "create_on_target_device")
    assert "create_on_target_device" not in lowered.fired and _fill_device(lowered) is None


def test_to_a_device_without_index_is_no_move_of_a_tensor_already_there():
    """`.to("cuda")` of an engine tensor on cuda:0 (the mask above, on a GPU machine) was refused as a move."""
    from torchkiln.conversion.converters.cast import _same_device

    assert _same_device(torch.device("cpu"), torch.device("cpu"))
    assert _same_device(torch.device("cuda", 1), torch.device("cuda", 1))
    assert not _same_device(torch.device("cuda", 1), torch.device("cuda", 0))
    assert not _same_device(torch.device("cuda"), torch.device("cpu"))
    if torch.cuda.is_available():
        assert _same_device(torch.device("cuda"), torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_mask_made_on_the_host_and_moved_is_made_in_a_cuda_engine():
    """64x64x64 values: more than build time folds, so the engine makes the mask itself."""
    x = torch.randn(64, 64, 64, device="cuda")
    check_compiled(MaskMadeOnTheHost("cuda"), (x,), engines=1, min_block_size=1)


class WindowsIntoBatch(nn.Module):
    """Hiera's unroll, traced: the batch of windows grows in place (`b *= 2`, an in-place mul on the traced size
    tensor) and each reshape reads `int(b)` between two such writes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        for _ in range(2):
            x = x.reshape(b, 2, -1, x.shape[-1]).flatten(0, 1)
            b *= 2
        return x.reshape(b, -1) * 2


def test_functionalize_size_arithmetic_rewrites_every_write_of_a_traced_size():
    lowered = check_pass(WindowsIntoBatch(), _x(2, 8, 3), ("remove_mutation", "functionalize_size_arithmetic"),
                         gone=("aten::mul_(",), trace=True)
    assert "aten::mul(" in str(lowered.graph)


def test_a_traced_size_grown_in_place_folds_and_the_model_is_one_engine():
    x = torch.randn(2, 8, 3)
    check_compiled(torch.jit.trace(WindowsIntoBatch(), (x,)), (x,), engines=1, min_block_size=1)


class BatchNormFirst(nn.Module):
    """BatchNorm2d checks `input.dim() != 4` with a raising prim::If."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def test_exception_or_pass_removes_a_guard_the_input_shapes_pass():
    check_pass(BatchNormFirst(), _x(2, 3, 4, 4), "eliminate_exception_or_pass", gone=("prim::RaiseException",))


def test_exception_or_pass_keeps_a_guard_the_input_shapes_fail():
    _, lowered = lower_only(BatchNormFirst(), _x(3, 4, 4), "eliminate_exception_or_pass")
    assert "prim::RaiseException" in str(lowered.graph) and "eliminate_exception_or_pass" not in lowered.fired
    with pytest.raises(torch.jit.Error, match="expected 4D input"):
        lowered.module(torch.randn(3, 4, 4))


class DataGuard(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.max() > 100.0):
            raise ValueError("too large")
        return x * 2


class InnerGuard(nn.Module):
    """The guard reads an intermediate tensor's rank: unknown until shape analysis."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(torch.relu(self.conv(x)))


@pytest.mark.parametrize("model", [DataGuard(), InnerGuard()], ids=["run-time data", "intermediate shape"])
def test_exception_or_pass_keeps_guards_it_cannot_decide(model):
    _, lowered = lower_only(model, _x(1, 3, 2, 2), "eliminate_exception_or_pass")
    assert "prim::RaiseException" in str(lowered.graph) and "eliminate_exception_or_pass" not in lowered.fired


class ShapeLoop(nn.Module):
    """Freezing unrolls loops of a constant trip count; this one's comes from the input's shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for j in range(x.size(1)):
            y = y * 2 - j
        return y


def test_unroll_loops_unrolls_short_static_loops():
    check_pass(ShapeLoop(), _x(2, 4), "unroll_loops", gone=("prim::Loop",))


def test_unroll_loops_leaves_long_loops():
    _, lowered = lower_only(ShapeLoop(), _x(2, unroll_module.MAX_TRIPS + 1), "unroll_loops")
    assert "prim::Loop" in str(lowered.graph) and "unroll_loops" not in lowered.fired


class IndexedList(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x + 1, x * 2]
        acc = x
        for i in range(x.size(0)):
            acc = acc + parts[i] * float(i * 3) + torch.relu(x)
        return acc


def test_constant_propagation_folds_unrolled_loop_counters():
    check_pass(IndexedList(), _x(2, 3), ("unroll_loops", "constant_propagation"), gone=("aten::Float(",))


def test_peephole_optimize_reads_list_elements_directly():
    check_pass(IndexedList(), _x(2, 3), ("unroll_loops", "constant_propagation", "peephole_optimize"),
               gone=("aten::__getitem__(",))


def test_eliminate_common_subexpression_merges_unrolled_copies():
    _, unrolled = lower_only(IndexedList(), _x(2, 3), "unroll_loops")
    assert str(unrolled.graph).count("aten::relu(") == 2
    lowered = check_pass(IndexedList(), _x(2, 3), ("unroll_loops", "eliminate_common_subexpression"))
    assert str(lowered.graph).count("aten::relu(") == 1


class OldLinear(nn.Module):
    """F.linear as TorchScript once wrote it: addmm for 2-D input, matmul + add_ otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4))
        self.bias = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            ret = torch.addmm(self.bias, x, self.weight.t())
        else:
            output = x.matmul(self.weight.t())
            output += self.bias
            ret = output
        return ret


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4)])
def test_fuse_addmm_branches_keeps_the_matmul_add_branch(shape):
    check_pass(OldLinear(), _x(*shape), ("remove_mutation", "fuse_addmm_branches"), gone=("aten::addmm(", "prim::If"),
               present=("aten::matmul(", "aten::add("))


def test_eliminate_dead_code_drops_the_fused_branch_condition():
    _, fused = lower_only(OldLinear(), _x(3, 4), "fuse_addmm_branches")
    assert "aten::dim(" in str(fused.graph)
    check_pass(OldLinear(), _x(3, 4), ("fuse_addmm_branches", "eliminate_dead_code"), gone=("aten::dim(",))


class RuntimeWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, w.t()) + self.bias


def test_fuse_linear_turns_matmul_of_a_transposed_weight_into_linear():
    check_pass(RuntimeWeight(), (torch.randn(3, 4), torch.randn(5, 4)), "fuse_linear",
               gone=("aten::matmul(", "aten::t("), present=("aten::linear(",))


# ---- removals and normalisations -----------------------------------------------------------

class AlphaDropouts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.AlphaDropout(0.2)
        self.feature_alpha = nn.FeatureAlphaDropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha(x) + self.feature_alpha(x)


def test_remove_dropout_removes_inference_dropout():
    check_pass(AlphaDropouts(), _x(2, 3, 4), "remove_dropout",
               gone=("aten::alpha_dropout(", "aten::feature_alpha_dropout("))


class TrainingDropout(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.alpha_dropout(x, 0.5, training=True)


def test_remove_dropout_keeps_dropout_that_trains():
    _, lowered = lower_only(TrainingDropout(), _x(2, 3), "remove_dropout")
    assert "aten::alpha_dropout(" in str(lowered.graph) and "remove_dropout" not in lowered.fired


class ContiguousView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous().view(-1) * 2


def test_view_to_reshape_keeps_contiguous_removal_valid():
    check_pass(ContiguousView(), _x(3, 4), ("view_to_reshape", "remove_contiguous"),
               gone=("aten::view(", "aten::contiguous("), present=("aten::reshape(",))


def test_remove_contiguous_keeps_a_copy_that_a_view_reads():
    _, lowered = lower_only(ContiguousView(), _x(3, 4), "remove_contiguous")
    assert "aten::contiguous(" in str(lowered.graph)


class ContiguousThenInplace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.t().contiguous()
        y.add_(1)
        return x + y.t()


def test_remove_contiguous_keeps_a_copy_that_is_written():
    _, lowered = lower_only(ContiguousThenInplace(), _x(3, 4), "remove_contiguous")
    assert "aten::contiguous(" in str(lowered.graph)
    x = torch.randn(3, 4)
    assert_matches_eager(lowered.module(x), ContiguousThenInplace()(x))


class Casts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.to(x.dtype) + x.type_as(x) + x.to(x.device) + x.to(memory_format=torch.channels_last)
        return y.to(torch.float64)


def test_remove_to_removes_noop_casts_and_keeps_real_ones():
    lowered = check_pass(Casts(), _x(1, 2, 3, 3), ("eliminate_common_subexpression", "remove_to"),
                         gone=("aten::type_as(",))
    tos = [n for n in lowered.graph.nodes() if n.kind() == "aten::to"]
    assert len(tos) == 1 and tos[0].inputsAt(1).toIValue() == 7  # the float64 cast (ScalarType 7)


# ---- unpacking -------------------------------------------------------------------------------

def _activations(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, torch.tensor([-3.0, 3.0, -30.0, 30.0, 0.0])])


@pytest.mark.parametrize("fn, pass_name, op, replacement", [
    (F.hardswish, "unpack_hardswish", "aten::hardswish(", "aten::clamp("),
    (F.hardsigmoid, "unpack_hardsigmoid", "aten::hardsigmoid(", "aten::clamp("),
    (F.silu, "unpack_silu", "aten::silu(", "aten::sigmoid("),
    (torch.rsqrt, "unpack_rsqrt", "aten::rsqrt(", "aten::reciprocal("),
], ids=["hardswish", "hardsigmoid", "silu", "rsqrt"])
def test_unpack_activation(fn, pass_name, op, replacement):
    x = _activations(torch.randn(64) * 4)
    if fn is torch.rsqrt:
        x = x.abs()
    check_pass(Fn(fn), (x,), pass_name, gone=(op,), present=(replacement,))


class Gelus(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([F.gelu(x), F.gelu(x, approximate="tanh")])


def test_unpack_gelu_both_variants():
    check_pass(Gelus(), (_activations(torch.randn(64) * 4),), "unpack_gelu", gone=("aten::gelu(",),
               present=("aten::erf(", "aten::tanh("))


class LogSoftmax(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return F.log_softmax(x, 1), F.log_softmax(x, 0, dtype=torch.float64)


def test_unpack_log_softmax_is_safe_where_softmax_underflows():
    x = torch.randn(3, 5)
    x[0, 0] = -200.0  # softmax underflows to 0 there; log(0) would be -inf
    check_pass(LogSoftmax(), (x,), "unpack_log_softmax", gone=("aten::log_softmax(",), present=("aten::logsumexp(",))


class Variances(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor, torch.Tensor]:
        return (x.var(), x.var(1), x.var(1, unbiased=False, keepdim=True), torch.var(x, (0, 2), correction=0),
                x.std(), x.std(2, correction=2.5, keepdim=True), torch.std(x, dim=1, correction=None))


def test_unpack_var_std_every_form():
    check_pass(Variances(), (torch.randn(3, 4, 5) * 3 + 1,), "unpack_var_std", gone=("aten::var(", "aten::std("),
               present=("aten::mean(", "aten::sqrt("))


class TooFewElements(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x.var(1), x.std(1, correction=3)  # one element: 0/0; two elements, correction 3: x/0


@pytest.mark.filterwarnings("ignore:var\\(\\)|std\\(\\)")
def test_unpack_var_std_divides_by_zero_like_eager():
    check_pass(TooFewElements(), (torch.tensor([[1.0], [2.0]]),), "unpack_var_std", gone=("aten::var(",))
    check_pass(TooFewElements(), (torch.tensor([[1.0, 2.0]]),), "unpack_var_std", gone=("aten::std(",))


class Tiles(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x.tile((2,)), x.tile((2, 1, 1, 3))


def test_replace_tile_with_repeat_pads_the_repeats():
    check_pass(Tiles(), _x(2, 3, 4), "replace_tile_with_repeat", gone=("aten::tile(",), present=("aten::repeat(",))


class Pads(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor, torch.Tensor]:
        return (F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), value=1.5), F.pad(x[0], (2, 1), mode="reflect"),
                F.pad(x, (1, 1, 2, 2), mode="reflect"), F.pad(x, (1, 0, 1, 0, 1, 1), mode="replicate"),
                F.pad(x[0], (1, 1), mode="circular"))


def test_normalize_pad_picks_the_op_for_each_mode():
    lowered = check_pass(Pads(), _x(2, 3, 4, 5), "normalize_pad",
                         present=("aten::constant_pad_nd(", "aten::reflection_pad1d(", "aten::reflection_pad2d(",
                                  "aten::replication_pad3d("))
    assert str(lowered.graph).count("aten::pad(") == 1  # circular


@pytest.mark.parametrize("conv, shape", [
    (nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1), (2, 3, 7)),
    (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, dilation=2), (1, 4, 5, 5)),
    (nn.ConvTranspose3d(2, 3, 2, bias=False), (1, 2, 3, 3, 3)),
], ids=["1d", "2d", "3d"])
def test_normalize_conv_transpose(conv, shape):
    check_pass(conv, _x(*shape), "normalize_conv_transpose", gone=("aten::conv_transpose",),
               present=("aten::_convolution(",))


class AddMM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 6))
        self.bias = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.addmm(self.bias, x, self.weight), torch.addmm(self.bias, x, self.weight, beta=0.5)


def test_unpack_addmm_unpacks_the_plain_form():
    lowered = check_pass(AddMM(), _x(3, 4), "unpack_addmm", present=("aten::matmul(", "aten::add("))
    assert str(lowered.graph).count("aten::addmm(") == 1  # beta=0.5 stays


class RoundTrips(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1) * x.size(1)


def test_remove_scalar_round_trips_on_a_traced_graph():
    """Tracing records aten::size as size -> prim::NumToTensor -> aten::Int; freezing removes that,
    so this runs the pass on the traced graph itself."""
    model, x = RoundTrips(), torch.randn(2, 3, 4)
    traced = torch.jit.trace(model, (x,))
    graph = traced.graph.copy()
    torch._C._jit_pass_inline(graph)
    assert "prim::NumToTensor(" in str(graph) and "aten::Int(" in str(graph)
    ctx = LoweringContext(CompileSettings.create([x]))
    assert PASSES["remove_scalar_round_trips"].fn(graph, ctx)
    torch._C._jit_pass_dce(graph)
    graph.lint()
    assert "aten::Int(" not in str(graph)
    fn = torch._C._create_function_from_graph("round_trips", graph)
    assert_matches_eager(fn(traced._c, x), model(x))


def test_scalar_round_trip_keeps_the_number_type():
    graph = torch._C.parse_ir("""
        graph(%n : int, %f : float):
            %t : Tensor = prim::NumToTensor(%n)
            %as_float : float = aten::Float(%t)
            %u : Tensor = prim::NumToTensor(%f)
            %same : float = aten::Float(%u)
            %sum : float = aten::add(%as_float, %same)
            return (%sum)""")
    ctx = LoweringContext(CompileSettings.create([torch.zeros(1)]))
    assert PASSES["remove_scalar_round_trips"].fn(graph, ctx)
    torch._C._jit_pass_dce(graph)
    graph.lint()
    assert "prim::NumToTensor" not in str(graph) and "aten::Float(%n)" in str(graph)
    assert torch._C._create_function_from_graph("f", graph)(3, 0.5) == 3.5


class ItemSetThenBranch(nn.Module):
    """Swin's shift logic: a copied list set by index, then read inside a later branch."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = [2, 3]

    def forward(self, x: torch.Tensor):
        shift = self.shift.copy()
        shift[0] = 0
        if bool(x.sum() > 0):  # a run-time branch: its read of the list still follows the item set
            x = torch.roll(x, shifts=(shift[0], shift[1]), dims=(0, 1))
        return x * sum(shift)


def test_functionalize_list_appends_redirects_reads_nested_in_later_branches():
    _, lowered = lower_only(ItemSetThenBranch(), _x(4, 5), "functionalize_list_appends")
    copied = lowered.graph.findNode("aten::copy")
    assert [u.user.kind() for u in copied.output().uses()] == ["aten::_set_item"], str(lowered.graph)
    assert "functionalize_list_appends" in lowered.fired
    for x in (torch.randn(4, 5), -torch.rand(4, 5)):
        assert_matches_eager(lowered.module(x), ItemSetThenBranch()(x))


def _silu_in_branch(x: torch.Tensor) -> torch.Tensor:
    if bool(x.sum() > 0):
        x = F.silu(x) * 2
    return x


def test_pattern_rewrite_finds_its_op_inside_a_branch():
    """rewrite() skips a pattern whose op is nowhere in the graph; an op only inside an If's block counts."""
    graph = torch.jit.script(_silu_in_branch).graph
    torch._C._jit_pass_inline(graph)
    assert graph.findNode("aten::silu", True) is not None and graph.findNode("aten::silu", False) is None
    assert PASSES["unpack_silu"].fn(graph, LoweringContext(CompileSettings.create([torch.randn(2)])))
    assert graph.findNode("aten::silu", True) is None and graph.findNode("aten::sigmoid", True) is not None


def raft_grid_sample(img: torch.Tensor, absolute_grid: torch.Tensor) -> torch.Tensor:
    """torchvision's optical_flow grid_sample: absolute pixel coordinates normalized for F.grid_sample."""
    h, w = img.shape[-2:]
    xgrid, ygrid = absolute_grid.split([1, 1], dim=-1)
    xgrid = 2 * xgrid / (w - 1) - 1
    if h > 1:
        ygrid = 2 * ygrid / (h - 1) - 1
    return F.grid_sample(img, torch.cat([xgrid, ygrid], dim=-1), mode="bilinear", align_corners=True)


def raft_coords_grid(batch_size: int, h: int, w: int) -> torch.Tensor:
    coords = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(coords[::-1], dim=0).float()[None].repeat(batch_size, 1, 1, 1)


class RaftConvGRU(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.convz = nn.Conv2d(hidden_size + input_size, hidden_size, 3, padding=1)
        self.convr = nn.Conv2d(hidden_size + input_size, hidden_size, 3, padding=1)
        self.convq = nn.Conv2d(hidden_size + input_size, hidden_size, 3, padding=1)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        hx = torch.cat([h, x], dim=1)
        z = torch.sigmoid(self.convz(hx))
        r = torch.sigmoid(self.convr(hx))
        q = torch.tanh(self.convq(torch.cat([r * h, x], dim=1)))
        return (1 - z) * h + z * q


class TinyRaft(nn.Module):
    """torchvision's RAFT cut small: a correlation pyramid looked up around the current coordinates by grid_sample,
    a motion encoder, a conv-GRU update block and a flow head, iterated `num_flow_updates` (a forward argument, so
    freezing does not unroll the loop: the compile binds it) times, each iteration's upsampled flow appended to a
    list the model returns."""

    def __init__(self, dim: int = 8, hidden: int = 8, levels: int = 2, radius: int = 1) -> None:
        super().__init__()
        self.levels, self.radius, self.hidden = levels, radius, hidden
        self.feature_encoder = nn.Sequential(nn.Conv2d(3, dim, 4, 4), nn.ReLU(), nn.Conv2d(dim, dim, 3, padding=1))
        self.context_encoder = nn.Sequential(nn.Conv2d(3, 2 * hidden, 4, 4), nn.ReLU())
        corr_channels = levels * (2 * radius + 1) ** 2
        self.convc = nn.Conv2d(corr_channels, 8, 1)
        self.convf = nn.Conv2d(2, 8, 3, padding=1)
        self.conv = nn.Conv2d(16, 6, 3, padding=1)
        self.gru = RaftConvGRU(hidden + 8, hidden)
        self.flow_head = nn.Sequential(nn.Conv2d(hidden, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 2, 3, padding=1))

    def index_pyramid(self, pyramid: List[torch.Tensor], centroids: torch.Tensor) -> torch.Tensor:
        batch, _, h, w = centroids.shape
        di = torch.linspace(-self.radius, self.radius, 2 * self.radius + 1)
        delta = torch.stack(torch.meshgrid(di, di, indexing="ij"), dim=-1).view(1, 2 * self.radius + 1,
                                                                                2 * self.radius + 1, 2)
        centroids = centroids.permute(0, 2, 3, 1).reshape(batch * h * w, 1, 1, 2)
        out = []
        for i in range(len(pyramid)):
            corr = raft_grid_sample(pyramid[i], centroids / 2**i + delta)
            out.append(corr.view(batch, h, w, -1))
        return torch.cat(out, dim=-1).permute(0, 3, 1, 2)

    def forward(self, image1: torch.Tensor, image2: torch.Tensor, num_flow_updates: int = 12) -> List[torch.Tensor]:
        fmaps = self.feature_encoder(torch.cat([image1, image2], dim=0))
        fmap1, fmap2 = torch.chunk(fmaps, chunks=2, dim=0)
        batch, c, h, w = fmap1.shape
        corr = torch.matmul(fmap1.view(batch, c, h * w).transpose(1, 2), fmap2.view(batch, c, h * w))
        corr = (corr / c ** 0.5).view(batch * h * w, 1, h, w)
        pyramid = [corr]
        for _ in range(self.levels - 1):
            corr = F.avg_pool2d(corr, kernel_size=2, stride=2)
            pyramid.append(corr)
        hidden, context = torch.split(self.context_encoder(image1), [self.hidden, self.hidden], dim=1)
        hidden, context = torch.tanh(hidden), torch.relu(context)
        coords0 = raft_coords_grid(batch, h, w)
        coords1 = raft_coords_grid(batch, h, w)
        flow_predictions = []
        for _ in range(num_flow_updates):
            coords1 = coords1.detach()
            corr_features = self.index_pyramid(pyramid, coords1)
            flow = coords1 - coords0
            motion = torch.relu(self.conv(torch.cat([torch.relu(self.convc(corr_features)),
                                                     torch.relu(self.convf(flow))], dim=1)))
            hidden = self.gru(hidden, torch.cat([context, motion, flow], dim=1))
            coords1 = coords1 + self.flow_head(hidden)
            flow_predictions.append(4 * F.interpolate(coords1 - coords0, scale_factor=4.0, mode="bilinear",
                                                      align_corners=True))
        return flow_predictions


def test_a_refinement_loop_that_appends_its_predictions_is_unrolled_into_one_engine():
    """RAFT's 12 flow updates: the loop body appends to a list, so no loop layer can hold it; it is over the
    budget of a loop that could be one, and unrolled under the larger budget of a loop that writes."""
    torch.manual_seed(0)
    model = torch.jit.script(TinyRaft().eval())
    body = max(sum(n.kind() != "prim::Constant" for n in walk_module.all_nodes(next(loop.blocks())))
               for loop in walk_module.all_nodes(torch.jit.freeze(model).graph.block()) if loop.kind() == "prim::Loop")
    assert 12 * body > unroll_module.MAX_NODES  # the case: over the budget of a loop a loop layer could hold
    check_compiled(model, [torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)])
