"""The CUDA planner's decisions, checked on the CPU (planning needs no GPU when tactic timing is off)."""

import pytest
import torch
from torch import nn

import torchkiln
from torchkiln.examples import SmallResNet
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime.backends import BackendOptions, BackendUnavailable
from torchkiln.runtime.backends.cuda import planner
from torchkiln.runtime.backends.cuda.codegen import have_triton
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.plan import check_steps

NO_TIMING = BackendOptions(timing_iterations=0)
needs_triton = pytest.mark.skipif(not have_triton(), reason="generated steps are planned only where Triton is installed")


def _ops(plan, network):
    return [(plan.kernels[s.kernel].op, [network.layers[j].KIND for j in s.layers]) for s in plan.steps]


@pytest.fixture(scope="module")
def resnet_fp16():
    data = torchkiln.convert_method_to_engine(SmallResNet().eval(), "forward", [torchkiln.Input((1, 3, 32, 32))],
                                              backend="reference", enabled_precisions={torch.float16})
    return Engine.deserialize(data).network


def test_residual_blocks_fuse_into_cudnn_calls_in_fp16(resnet_fp16):
    plan = planner.make_plan(resnet_fp16, torch.device("cpu"), NO_TIMING)
    check_steps(resnet_fp16, plan.steps)
    ops = [op for op, _ in _ops(plan, resnet_fp16)]
    assert ops.count("conv_add_relu") >= 4 and ops.count("conv_relu") >= 4
    assert ops.count("convolution") <= 3  # one per downsampling block: its add is the other conv's epilogue
    assert all(plan.kernels[s.kernel].option("channels_last") for s in plan.steps
               if plan.kernels[s.kernel].op.startswith("conv"))


@needs_triton
def test_fp32_convolutions_fuse_only_where_tf32_is_allowed():
    data = torchkiln.convert_method_to_engine(SmallResNet().eval(), "forward", [torchkiln.Input((1, 3, 32, 32))],
                                              backend="reference")
    network = Engine.deserialize(data).network
    strict = [op for op, _ in _ops(planner.make_plan(network, torch.device("cpu"), NO_TIMING), network)]
    assert "conv_relu" not in strict and "conv_add_relu" not in strict
    # each convolution runs without its bias; bias, ReLU and residual add are its generated epilogue
    # (a downsampling branch's convolution feeds an add the block's last convolution leads: it stays plain)
    convs = sum(isinstance(x, L.ConvolutionLayer) for x in network.layers)
    assert strict.count("conv_epilogue") + strict.count("convolution") == convs and strict.count("convolution") <= 3
    tf32 = BackendOptions(timing_iterations=0, allow_tf32=True)
    assert "conv_add_relu" in [op for op, _ in _ops(planner.make_plan(network, torch.device("cpu"), tf32), network)]


def test_a_residual_made_after_the_convolution_runs_the_fused_step_at_the_add():
    """conv(x) + downsample(x): the downsample is after the convolution in layer order."""
    net = Network("late_residual")
    x = net.add_input("x", torch.float16, (1, 4, 8, 8))
    conv = net.add_convolution_nd(x, torch.randn(4, 4, 3, 3).half(), torch.randn(4).half(), stride=(1, 1),
                                  padding=(1, 1), dilation=(1, 1)).get_output()
    down = net.add_convolution_nd(x, torch.randn(4, 4, 1, 1).half(), None, stride=(1, 1), padding=(0, 0),
                                  dilation=(1, 1)).get_output()
    added = net.add_elementwise(conv, down, L.ElementWiseOperation.SUM).get_output()
    net.mark_output(net.add_activation(added, L.ActivationType.RELU).get_output())
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    assert _ops(plan, net) == [("convolution", ["convolution"]),
                               ("conv_add_relu", ["convolution", "elementwise", "activation"])]


@needs_triton
def test_pointwise_chains_become_one_generated_step():
    """exp(gelu(x * w)), with a per-channel operand: one step; an op reading a later tensor starts anew."""
    net = Network("chain")
    x = net.add_input("x", torch.float32, (2, 8, 4))
    w = net.add_constant(torch.randn(1, 8, 1)).get_output()
    a = net.add_elementwise(x, w, L.ElementWiseOperation.PROD).get_output()
    b = net.add_activation(a, L.ActivationType.GELU_ERF).get_output()
    c = net.add_unary(b, L.UnaryOperation.EXP).get_output()
    s = net.add_reduce(c, L.ReduceOperation.PROD, (1,), keep_dims=True).get_output()  # a product: not generated
    d = net.add_elementwise(c, s, L.ElementWiseOperation.SUB).get_output()  # reads the reduction: new group
    net.mark_output(d)
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    assert _ops(plan, net) == [("constant", ["constant"]),
                               ("pointwise", ["elementwise", "activation", "unary"]),
                               ("reduce", ["reduce"]), ("pointwise", ["elementwise"])]
    io = plan.io(net)
    assert len(io[1].outputs) == 1  # only exp's output leaves the group


@needs_triton
def test_a_dynamic_network_plans_and_round_trips():
    s = DimSymbol("s0", 1, 8, (1, 4, 8))
    net = Network("dyn")
    x = net.add_input("x", torch.float32, (s, 16))
    y = net.add_activation(net.add_unary(x, L.UnaryOperation.EXP).get_output(), L.ActivationType.RELU).get_output()
    net.mark_output(y)
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    assert _ops(plan, net) == [("pointwise", ["unary", "activation"])]
    assert plan.memory(net).arena_bytes == 0  # exp's output never leaves the step


@needs_triton
def test_half_layer_norm_between_casts_is_one_step():
    net = Network("ln")
    x = net.add_input("x", torch.float16, (2, 8, 16))
    up = net.add_cast(x, torch.float32).get_output()
    norm = net.add_layer(L.NormalizationLayer, [up], weights={"scale": torch.randn(16), "bias": torch.randn(16)},
                         kind=L.NormalizationKind.LAYER, epsilon=1e-5, normalized_shape=(16,)).get_output()
    net.mark_output(net.add_cast(norm, torch.float16).get_output())
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    assert _ops(plan, net) == [("rows", ["cast", "normalization", "cast"])]
    assert plan.kernels[0].kind == "generated"
    with pytest.MonkeyPatch.context() as mp:  # without Triton: CUDA's layer norm on the half input
        mp.setattr(planner, "have_triton", lambda: False)
        plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    assert [(k.kind, k.op) for k in plan.kernels] == [("library", "layer_norm")]


class ResidualNorms(nn.Module):
    """Two transformer sublayers (a linear layer standing in for attention, then a feed-forward one): post-norm
    (BERT: x = ln(x + f(x))) or pre-norm (ViT, GPT-2: x = x + f(ln(x)))."""

    def __init__(self, pre_norm: bool, d: int = 16) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn, self.ffn = nn.Linear(d, d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + torch.relu(self.ffn(self.ln2(x)))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + torch.relu(self.ffn(x)))


def _block(pre_norm: bool, dtype: torch.dtype) -> Network:
    module = ResidualNorms(pre_norm).to(dtype).eval()
    data = torchkiln.convert_method_to_engine(module, "forward", [torchkiln.Input((2, 5, 16), dtype=dtype)],
                                              backend="reference", enabled_precisions={dtype})
    return Engine.deserialize(data).network


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_post_norm_residual_adds_join_their_layer_norms(dtype):
    """BERT's layer: the residual add, the precision casts and the layer norm are one generated kernel."""
    net = _block(False, dtype)
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    norm = ["elementwise", "cast", "normalization", "cast"] if dtype == torch.float16 else ["elementwise",
                                                                                           "normalization"]
    ops = _ops(plan, net)
    assert [kinds for op, kinds in ops if op == "rows"] == [norm, ["activation", *norm]]  # ReLU joins as prologue
    assert not any(op == "pointwise" for op, _ in ops)
    assert all(len(io.outputs) == 1 for s, io in zip(plan.steps, plan.io(net))
               if plan.kernels[s.kernel].op == "rows")  # nothing else reads the sums


@needs_triton
def test_pre_norm_residual_add_joins_the_next_layer_norm_and_writes_the_sum():
    """ViT, GPT-2: x = x + attn(ln1(x)) is the residual stream that the next sublayer adds to, and ln2's input."""
    net = _block(True, torch.float16)
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    steps = [(op, kinds, len(io.outputs)) for (op, kinds), io in zip(_ops(plan, net), plan.io(net))
             if op == "rows"]
    assert steps == [("rows", ["cast", "normalization", "cast"], 1),
                     ("rows", ["elementwise", "cast", "normalization", "cast"], 2)]


def _norm_of_sum(shape_b: tuple[int, ...], size: int = 16) -> Network:
    net = Network("sum_norm")
    x = net.add_input("x", torch.float32, (2, size))
    r = net.add_input("r", torch.float32, shape_b)
    s = net.add_elementwise(x, r, L.ElementWiseOperation.SUM).get_output()
    net.mark_output(net.add_layer(L.NormalizationLayer, [s], weights={}, kind=L.NormalizationKind.LAYER,
                                  epsilon=1e-5, normalized_shape=(size,)).get_output())
    return net


@needs_triton
def test_an_add_of_a_broadcast_operand_joins_and_long_rows_are_generated_too():
    for shape_b, size in (((1, 16), 16), ((2, 20000), 20000)):  # long rows: reduced in passes
        net = _norm_of_sum(shape_b, size)
        assert _ops(planner.make_plan(net, torch.device("cpu"), NO_TIMING), net) == [
            ("rows", ["elementwise", "normalization"])]


@needs_triton
def test_a_2d_max_pool_is_a_generated_step():
    """conv -> relu -> max pool 3x3/2/1 (a ResNet stem): the pool runs in the generated max pool kernel; an average
    pool and a 1-d max pool are generated indexed kernels (window reads)."""
    net = Network("stem")
    x = net.add_input("x", torch.float16, (1, 3, 16, 16))
    conv = net.add_convolution_nd(x, torch.randn(8, 3, 3, 3).half(), torch.randn(8).half(), stride=(1, 1),
                                  padding=(1, 1), dilation=(1, 1)).get_output()
    relu = net.add_activation(conv, L.ActivationType.RELU).get_output()
    pooled = net.add_pooling_nd(relu, L.PoolingType.MAX, (3, 3), stride=(2, 2), padding=(1, 1)).get_output()
    net.mark_output(net.add_pooling_nd(pooled, L.PoolingType.AVERAGE, (2, 2), stride=(2, 2), padding=(0,))
                    .get_output())
    flat = net.add_input("flat", torch.float32, (1, 4, 9))
    net.mark_output(net.add_pooling_nd(flat, L.PoolingType.MAX, (2,), stride=(2,), padding=(0,)).get_output())
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    assert _ops(plan, net) == [("conv_relu", ["convolution", "activation"]), ("max_pool", ["pooling"]),
                               ("indexed", ["pooling"]), ("indexed", ["pooling"])]
    assert plan.kernels[plan.steps[1].kernel].kind == "generated"


def test_a_timed_choice_is_the_fastest_candidate_cached_and_skips_refusals(tmp_path, monkeypatch):
    """The tactics' shared chooser, with a timer that reports each candidate's own number (CUDA events need a GPU):
    the fastest accepted candidate wins, a refused one (RuntimeError) is skipped, and a cached choice is returned
    without making the candidates."""
    from torchkiln.runtime.backends.cuda import timing
    from torchkiln.runtime.backends.cuda.cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cache = timing.TimingCache.load()

    def refused():
        raise RuntimeError("no kernel for these inputs")

    made = []

    def candidates():
        made.append(1)
        return {"slow": lambda: 3.0, "fast_but_refused": refused, "fast": lambda: 1.0}

    def timer(run, iterations):
        return run()

    assert timing._timed_choice(cache, "k", candidates, timer, 1, "test") == "fast"
    assert timing._timed_choice(cache, "k", candidates, timer, 1, "test") == "fast" and made == [1]
    assert timing._timed_choice(cache, "all refused", lambda: {"a": refused}, timer, 1, "test") == ""



def test_a_timed_choice_runs_its_candidates_in_this_thread_after_a_pass_that_compiles_them(tmp_path, monkeypatch):
    """Each candidate runs first in a pass where generated launches only queue their compiles (side by side on other
    threads: `codegen.compiling_ahead`), then once for real and then in its timing, always in the calling thread:
    SDPA's backend choice is process-wide state that threads would leave wrong. A candidate failing its first call is
    never timed."""
    import threading

    from torchkiln.runtime.backends.cuda import timing
    from torchkiln.runtime.backends.cuda.cache import CACHE_ENV
    from torchkiln.runtime.backends.cuda.codegen import is_compiling_ahead

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cache = timing.TimingCache.load()
    me = threading.get_ident()
    seen: dict[str, list] = {"library": [], "generated": [], "broken": []}

    def run(name, seconds, fails=False):
        def call():
            seen[name].append((threading.get_ident() == me, is_compiling_ahead()))
            if fails:
                raise RuntimeError("does not compile here")
            return seconds
        return call

    def candidates():
        return {"library": run("library", 2.0), "generated": run("generated", 3.0), "broken": run("broken", 1.0, True)}

    choice = timing._timed_choice(cache, "k", candidates, lambda fn, iterations: fn(), 1, "test")
    assert choice == "library"
    assert seen["library"] == seen["generated"] == [(True, True), (True, False), (True, False)]
    assert seen["broken"] == [(True, True), (True, False)]  # failed its first call: never timed


def test_attention_steps_called_from_several_threads_leave_sdpas_backend_flags_as_they_were():
    """An attention step with a chosen backend enters `sdpa_kernel`, which sets process-wide flags and restores what
    it found on leaving. Steps of engines called from several threads at once left one backend on, or none, for every
    later attention in the process; they now take turns (the flags are the same on CPU tensors)."""
    import sys
    import threading

    from torchkiln.runtime.backends.cuda import timing

    flags = torch.backends.cuda
    before = (flags.flash_sdp_enabled(), flags.mem_efficient_sdp_enabled(), flags.math_sdp_enabled(),
              flags.cudnn_sdp_enabled())
    q = torch.randn(1, 2, 8, 4)
    steps = [timing.sdpa(b) for b in ("math", "flash", "efficient", "cudnn", "math")]

    def calls(step):
        for _ in range(200):
            try:
                step(q, q, q, None)
            except RuntimeError:  # a GPU backend on CPU tensors: refused, the flags restored all the same
                pass

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: without the turns this left the flags wrong every run
    try:
        threads = [threading.Thread(target=calls, args=(step,)) for step in steps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert (flags.flash_sdp_enabled(), flags.mem_efficient_sdp_enabled(), flags.math_sdp_enabled(),
            flags.cudnn_sdp_enabled()) == before

def test_attention_operands_reach_sdpa_with_their_last_dim_contiguous():
    """SDPA's fused kernels refuse an operand strided along its last dim (a position bias permuted from
    [L, S, heads]; a value viewed channels-first out of its projection): it is copied to row-major first, values
    unchanged; one contiguous along its last dim (expanded over the batch included) is passed as it is."""
    from torchkiln.runtime.backends.cuda.timing import last_dim_contiguous

    permuted = torch.randn(6, 5, 4).permute(2, 0, 1)[None].expand(3, 4, 6, 5)
    fixed = last_dim_contiguous(permuted)
    assert permuted.stride(-1) != 1 and fixed.stride(-1) == 1 and torch.equal(fixed, permuted)
    value = torch.randn(2, 196, 3, 4, 32).permute(2, 0, 3, 4, 1)[2]  # [B, heads, d, tokens], tokens strided
    fixed = last_dim_contiguous(value)
    assert value.stride(-1) == 384 and fixed.stride(-1) == 1 and torch.equal(fixed, value)
    expanded = torch.randn(1, 4, 6, 5).expand(3, 4, 6, 5)
    assert last_dim_contiguous(expanded) is expanded and last_dim_contiguous(None) is None


def test_a_constant_attention_mask_is_aligned_once_without_making_broadcast_dims():
    """SDPA's memory-efficient backend pads, on every call, a mask whose strides but the last are not multiples of 8
    (a window attention's 49 keys): a constant one is made aligned once, values unchanged, the dims it broadcasts
    along left at stride 0 (nothing made for them); an aligned mask is passed as it is."""
    from torchkiln.runtime.backends.cuda.timing import MASK_ALIGN, aligned_mask, constant_mask

    bias = torch.randn(3, 49, 49)
    for mask in (bias, bias[None].expand(4, 3, 49, 49), bias.permute(0, 2, 1)):
        fixed = aligned_mask(mask)
        assert torch.equal(fixed, mask) and fixed.stride(-1) == 1
        assert all(st % MASK_ALIGN == 0 for st in fixed.stride()[:-1])
        assert fixed.untyped_storage().nbytes() <= 3 * 49 * 56 * 4  # the broadcast batch dim is not made
    aligned = torch.randn(2, 3, 7, 16)[..., :16]
    assert aligned_mask(aligned) is aligned

    net = Network("window attention")
    q = net.add_input("q", torch.float16, (2, 3, 49, 32))
    const = net.add_constant(bias.half()[None]).get_output()
    assert constant_mask(net.add_attention(q, q, q, const))
    assert not constant_mask(net.add_attention(q, q, q, net.add_input("m", torch.float16, (2, 3, 49, 49))))
    assert not constant_mask(net.add_attention(q, q, q, net.add_constant(torch.ones(49, 49, dtype=torch.bool))
                                               .get_output()))  # SDPA makes an additive mask of it per call anyway


def _rotary(read_by_matmul: bool = False) -> Network:
    """q * cos + cat(-q[..., 8:], q[..., :8]) * sin (rotate-half), q made by a matrix multiply."""
    net = Network("rotary")
    x = net.add_input("x", torch.float16, (2, 4, 6, 16))
    q = net.add_matrix_multiply(x, L.MatrixOperation.NONE, net.add_constant(torch.randn(16, 16).half()).get_output(),
                                L.MatrixOperation.NONE).get_output()
    cos, sin = (net.add_constant(torch.randn(1, 1, 6, 16).half()).get_output() for _ in range(2))
    lo = net.add_slice(q, (0, 0, 0, 0), (2, 4, 6, 8), (1, 1, 1, 1)).get_output()
    hi = net.add_slice(q, (0, 0, 0, 8), (2, 4, 6, 8), (1, 1, 1, 1)).get_output()
    rotated = net.add_concatenation([net.add_unary(hi, L.UnaryOperation.NEG).get_output(), lo], axis=3).get_output()
    if read_by_matmul:
        net.mark_output(net.add_matrix_multiply(rotated, L.MatrixOperation.NONE, x,
                                                L.MatrixOperation.TRANSPOSE).get_output())
        return net
    net.mark_output(net.add_elementwise(net.add_elementwise(q, cos, L.ElementWiseOperation.PROD).get_output(),
                                        net.add_elementwise(rotated, sin, L.ElementWiseOperation.PROD).get_output(),
                                        L.ElementWiseOperation.SUM).get_output())
    return net


@needs_triton
def test_rotate_half_is_one_indexed_step_with_its_slices_and_multiplies():
    net = _rotary()
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    assert [op for op in _ops(plan, net) if op[0] != "constant"] == [
        ("matrix_multiply", ["matrix_multiply"]),
        ("indexed", ["slice", "slice", "unary", "concatenation", "elementwise", "elementwise", "elementwise"])]


@needs_triton
def test_a_concatenation_read_by_a_library_call_is_one_indexed_step_with_what_feeds_it():
    net = _rotary(read_by_matmul=True)
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    check_steps(net, plan.steps)
    assert [op for op in _ops(plan, net) if op[0] != "constant"] == [
        ("matrix_multiply", ["matrix_multiply"]), ("indexed", ["slice", "slice", "unary", "concatenation"]),
        ("matrix_multiply", ["matrix_multiply"])]


@needs_triton
def test_views_that_copy_nothing_stay_views():
    """A transpose read by a matrix multiply is a view: no kernel is made for it."""
    net = Network("views")
    x = net.add_input("x", torch.float16, (2, 6, 6, 16))
    t = net.add_shuffle(x, first_transpose=(0, 2, 1, 3)).get_output()
    net.mark_output(net.add_matrix_multiply(t, L.MatrixOperation.NONE, x, L.MatrixOperation.TRANSPOSE).get_output())
    plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
    assert [op for op, _ in _ops(plan, net)] == ["shuffle", "matrix_multiply"]


def test_heads_merged_after_attention_stay_a_reshape_that_may_be_a_view():
    """attention [N, H, L, E] -> transpose(1, 2) -> reshape [N, L, H * E] -> output projection: SDPA's fused
    backends return [N, L, H, E] memory, so the reshape is a view there; it stays ATen's reshape (a copy only
    where a backend's layout needs one), not a generated copy. The same reshape of a transposed input copies."""
    def heads_merged(after_attention: bool) -> list[str]:
        net = Network("merge")
        q = net.add_input("q", torch.float16, (2, 4, 6, 16))
        x = net.add_attention(q, q, q).get_output() if after_attention else q
        merged = net.add_shuffle(x, first_transpose=(0, 2, 1, 3), reshape_dims=(2, 6, 64)).get_output()
        w = net.add_constant(torch.randn(64, 64, dtype=torch.float16)).get_output()
        net.mark_output(net.add_matrix_multiply(merged, L.MatrixOperation.NONE, w, L.MatrixOperation.NONE)
                        .get_output())
        plan = planner.make_plan(net, torch.device("cpu"), NO_TIMING)
        return [op for op, _ in _ops(plan, net) if op != "constant"]

    assert heads_merged(True) == ["attention", "shuffle", "matrix_multiply"]
    assert heads_merged(False) == ["indexed", "matrix_multiply"]


def test_a_permute_joins_pointwise_steps_only_between_two_of_them():
    """relu -> permute -> matrix multiply: the permute stays a view (no pointwise step reads it, so a kernel would
    save no pass); relu -> permute -> add: one indexed kernel."""
    def ops(then_add: bool) -> list[str]:
        net = Network("permute")
        x = net.add_input("x", torch.float16, (2, 6, 4, 16))
        moved = net.add_shuffle(net.add_activation(x, L.ActivationType.RELU).get_output(),
                                first_transpose=(0, 2, 1, 3)).get_output()
        if then_add:
            out = net.add_elementwise(moved, net.add_input("y", torch.float16, (2, 4, 6, 16)),
                                      L.ElementWiseOperation.SUM)
        else:
            out = net.add_matrix_multiply(moved, L.MatrixOperation.NONE, moved, L.MatrixOperation.TRANSPOSE)
        net.mark_output(out.get_output())
        return [op for op, _ in _ops(planner.make_plan(net, torch.device("cpu"), NO_TIMING), net)]

    assert ops(False) == ["pointwise", "shuffle", "matrix_multiply"]
    assert ops(True) == ["indexed"]


def test_data_dependent_sizes_are_left_to_the_reference_backend():
    """A CUDA graph replays fixed sizes: an engine whose nonzero sizes an output when it runs is not planned here
    (the engine then runs on the reference backend, on the GPU, with this reason logged)."""
    n = Network("nz")
    n.mark_output(n.add_non_zero(n.add_input("x", torch.float32, (3, 4))).get_output())
    with pytest.raises(BackendUnavailable, match="non_zero layer 'non_zero'.*reference backend"):
        planner.make_plan(n, torch.device("cpu"), NO_TIMING)
