"""Why the CUDA planner leaves each pair of steps apart (runtime/backends/cuda/fusion_report.py): generic blocks, how
many steps each becomes, and the exact reason of every value one step makes and another reads (CPU: the planner
without timing)."""
import logging

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.runtime import backends  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import fusion_report, planner  # noqa: E402
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen.indexed import MAX_LAYERS  # noqa: E402
from torchkiln.runtime.profile import EngineProfile, StepRow, format_profile  # noqa: E402

CPU = torch.device("cpu")
OPTIONS = BackendOptions(timing_iterations=0)
MATMUL = "is a library matrix_multiply step: matrix multiplies keep cuBLAS's bias only: no generated epilogue " \
         "(rule 6: linear layers stay on cuBLAS; rule 8b generates products of at most 8 terms an output)"


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("torchkiln-cache")))
        yield


def report(net: Network):
    """The plan's steps other than constants, as (kind, op), and its unfused edges as (producer step, reader step,
    tensor, reason), steps counted among all the plan's steps."""
    plan = planner.make_plan(net, CPU, OPTIONS)
    steps = [(plan.kernels[s.kernel].kind, plan.kernels[s.kernel].op) for s in plan.steps
             if plan.kernels[s.kernel].op != "constant"]
    edges = fusion_report.unfused_edges(net, plan)
    assert all(e.reason for e in edges)
    return plan, steps, [(e.producer, e.reader, e.tensor, e.reason) for e in edges]


def attention_by_hand():
    """softmax(q @ k^T) @ v, as layers: the products are library calls, the softmax a row kernel."""
    net = Network("attention")
    q, k, v = (net.add_input(n, torch.float32, s) for n, s in (("q", (2, 6, 12)), ("k", (2, 9, 12)),
                                                                 ("v", (2, 9, 12))))
    scores = net.add_matrix_multiply(q, L.MatrixOperation.NONE, k, L.MatrixOperation.TRANSPOSE)
    probs = net.add_softmax(scores.get_output(), 2)
    out = net.add_matrix_multiply(probs.get_output(), L.MatrixOperation.NONE, v, L.MatrixOperation.NONE)
    net.mark_output(out.get_output())
    return net, [
        (0, 1, scores.get_output().name, f"the producer, matrix_multiply {scores.name!r}, {MATMUL}"),
        (1, 2, probs.get_output().name, f"the reader, matrix_multiply {out.name!r}, is a library call (cuBLAS reads "
                                        f"its operands from memory: no generated prologue)")]


def convolution_read_twice():
    """conv -> ReLU and conv -> max pool: the convolution's epilogue takes its only reader, and it has two."""
    net = Network("conv-two-readers")
    x = net.add_input("x", torch.float32, (2, 4, 8, 8))
    conv = net.add_convolution_nd(x, torch.randn(4, 4, 3, 3), torch.randn(4), stride=(1, 1), padding=(1, 1),
                                  dilation=(1, 1))
    relu = net.add_activation(conv.get_output(), L.ActivationType.RELU)
    pool = net.add_pooling_nd(conv.get_output(), L.PoolingType.MAX, (2, 2), stride=(2, 2), padding=(0, 0))
    net.mark_output(relu.get_output())
    net.mark_output(pool.get_output())
    t = conv.get_output().name
    why = f"{t!r} has 2 readers: activation {relu.name!r} (step 1), pooling {pool.name!r} (step 2): a convolution's " \
          f"epilogue takes its only reader (rules 1, 2, 6)"
    return net, [(0, 1, t, why), (0, 2, t, why)]


def pointwise_output_returned_and_read():
    """a = exp(x) and b = a + 1 (returned) are one pointwise step; cat([a, y]) * 2 is one indexed step, which
    cannot take the pointwise step: that step's outputs include an engine output."""
    net = Network("returned")
    x, y = net.add_input("x", torch.float32, (4, 8)), net.add_input("y", torch.float32, (4, 8))
    a = net.add_unary(x, L.UnaryOperation.EXP).get_output()
    one = net.add_constant(torch.ones(1, 1)).get_output()
    b = net.add_elementwise(a, one, L.ElementWiseOperation.SUM)
    cat = net.add_concatenation([a, y], 1).get_output()
    two = net.add_constant(torch.full((1, 1), 2.0)).get_output()
    net.mark_output(net.add_elementwise(cat, two, L.ElementWiseOperation.PROD).get_output())
    net.mark_output(b.get_output())
    return net, [(2, 3, a.name, f"step 2 makes {b.get_output().name!r}, an engine output (written to memory "
                                "anyway): an indexed kernel takes only the steps one step alone feeds (rule 8)")]


def aten_layer_between():
    """exp -> top-k -> ReLU: the top-k runs on ATen, between two generated steps."""
    net = Network("aten-between")
    x = net.add_input("x", torch.float32, (4, 8))
    e = net.add_unary(x, L.UnaryOperation.EXP).get_output()
    topk = net.add_topk(e, L.TopKOperation.MAX, 2, 1)
    net.mark_output(net.add_activation(topk.get_output(0), L.ActivationType.RELU).get_output())
    why = f"topk {topk.name!r}, runs on ATen: no generated kernel for topk layers"
    return net, [(0, 1, e.name, f"the reader, {why}"), (1, 2, topk.get_output(0).name, f"the producer, {why}")]


def concatenation_over_too_many_layers():
    """cat([x, y]) -> MAX_LAYERS negations: rule 8 refuses the indexed kernel (one layer too many), and the
    concatenation stays on ATen with the reason `_indexed_refusal` gives."""
    net = Network("long-chain")
    x, y = net.add_input("x", torch.float32, (4, 8)), net.add_input("y", torch.float32, (4, 8))
    cat = net.add_concatenation([x, y], 1)
    t = cat.get_output()
    for _ in range(MAX_LAYERS):
        t = net.add_unary(t, L.UnaryOperation.NEG).get_output()
    net.mark_output(t)
    return net, [(0, 1, cat.get_output().name,
                  f"the producer, concatenation {cat.name!r}, runs on ATen: rule 8 does not take it: the kernel would "
                  f"compute {MAX_LAYERS + 1} layers (at most {MAX_LAYERS})")]


def gate_over_another_space():
    """sigmoid(g) * x, g of shape [2, 4, 1, 1] and x [2, 4, 3, 3]: the product cannot join the sigmoid's group, nor
    can that group run inside the product's (rule 2: one iteration space a group)."""
    net = Network("gate")
    g, x = net.add_input("g", torch.float32, (2, 4, 1, 1)), net.add_input("x", torch.float32, (2, 4, 3, 3))
    gate = net.add_activation(g, L.ActivationType.SIGMOID).get_output()
    prod = net.add_elementwise(gate, x, L.ElementWiseOperation.PROD)
    net.mark_output(prod.get_output())
    return net, [(0, 1, gate.name, f"elementwise {prod.name!r} cannot join the group of step 0: its output's shape "
                                   f"[2, 4, 3, 3] is not the group's [2, 4, 1, 1]; the group of step 0 cannot run "
                                   f"inside step 1: their shapes differ ([2, 4, 1, 1] and [2, 4, 3, 3])")]


def product_made_after_the_softmax():
    """softmax(x) * (x @ W): the product is made after the softmax's row group would run (at its first layer)."""
    net = Network("late")
    x = net.add_input("x", torch.float32, (4, 12))
    s = net.add_softmax(x, 1).get_output()
    w = net.add_constant(torch.randn(12, 12)).get_output()
    mm = net.add_matrix_multiply(x, L.MatrixOperation.NONE, w, L.MatrixOperation.NONE)
    prod = net.add_elementwise(s, mm.get_output(), L.ElementWiseOperation.PROD)
    net.mark_output(prod.get_output())
    return net, [
        (1, 3, s.name, f"elementwise {prod.name!r} stays out of the row group of {s.producer.name!r}: the group "
                       f"would read [{mm.get_output().name!r}] before they are made (it runs at its first layer)"),
        (2, 3, mm.get_output().name, f"the producer, matrix_multiply {mm.name!r}, {MATMUL}")]


def convolutions_after_a_pointwise_step():
    """exp -> depthwise conv -> ReLU -> 1x1 conv (fp32): each convolution reads its input from memory; rule 6 had a
    generated depthwise kernel for the first (not kept: no timing here) and no generated GEMM for the second."""
    net = Network("convolutions")
    x = net.add_input("x", torch.float32, (2, 4, 6, 6))
    e = net.add_unary(x, L.UnaryOperation.EXP).get_output()
    dw = net.add_convolution_nd(e, torch.randn(4, 1, 3, 3), torch.randn(4), stride=(1, 1), padding=(1, 1),
                                dilation=(1, 1), groups=4)
    relu = net.add_activation(dw.get_output(), L.ActivationType.RELU).get_output()
    pw = net.add_convolution_nd(relu, torch.randn(8, 4, 1, 1), torch.randn(8), stride=(1, 1), padding=(0, 0),
                                dilation=(1, 1))
    net.mark_output(pw.get_output())
    library = "is a library call (cuDNN reads its operands from memory: no generated prologue)"
    return net, [
        (0, 1, e.name, f"the reader, convolution {dw.name!r}, {library}; a generated depthwise kernel was a candidate "
                       f"(rule 6) and was not kept (the library step timed faster, or timing was off)"),
        (1, 2, relu.name, f"the reader, convolution {pw.name!r}, {library}; no generated GEMM (rule 6): dtype "
                          f"torch.float32: generated GEMMs are half precision")]


CASES = {  # name -> (the network and its edges, the plan's steps other than constants)
    "attention-by-hand": (attention_by_hand, [("library", "matrix_multiply"), ("generated", "rows"),
                                              ("library", "matrix_multiply")]),
    "convolution-read-twice": (convolution_read_twice, [("library", "conv_epilogue"), ("generated", "pointwise"),
                                                        ("generated", "max_pool")]),
    "pointwise-output-returned": (pointwise_output_returned_and_read, [("generated", "pointwise"),
                                                                       ("generated", "indexed")]),
    "aten-between": (aten_layer_between, [("generated", "pointwise"), ("aten", "topk"), ("generated", "pointwise")]),
    "too-many-layers": (concatenation_over_too_many_layers, [("aten", "concatenation"), ("generated", "pointwise")]),
    "gate-over-another-space": (gate_over_another_space, [("generated", "pointwise"), ("generated", "pointwise")]),
    "convolutions": (convolutions_after_a_pointwise_step, [("generated", "pointwise"), ("library", "conv_epilogue"),
                                                          ("library", "conv_epilogue")]),
    "product-after-softmax": (product_made_after_the_softmax, [("generated", "rows"), ("library", "matrix_multiply"),
                                                               ("generated", "pointwise")]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_block_becomes_these_steps_and_says_why_each_pair_is_apart(name):
    build, expected_steps = CASES[name]
    net, expected_edges = build()
    _, steps, edges = report(net)
    assert steps == expected_steps
    assert edges == expected_edges


def test_the_cuda_backend_logs_each_unfused_edge_after_planning(caplog):
    net, edges = attention_by_hand()
    with caplog.at_level(logging.DEBUG, logger=fusion_report.__name__):
        plan = backends.make_plan("cuda", net, CPU, OPTIONS)
    steps = [fusion_report.describe_step(net, plan, k) for k in range(len(plan.steps))]
    assert steps[0] == f"step 0 (library matrix_multiply: {net.layers[0].name})"
    lines = [r.getMessage() for r in caplog.records if r.name == fusion_report.__name__]
    assert lines == [f"{steps[a]} -> {steps[b]}: {why}" for a, b, _, why in edges]


def test_the_step_profile_lists_the_unfused_edges():
    """`bench --profile`'s table for a cuda engine ends with the pairs of steps left apart."""
    net, _ = aten_layer_between()
    plan = planner.make_plan(net, CPU, OPTIONS)
    lines = fusion_report.format_edges(net, plan)
    profile = EngineProfile("e", "cuda", [StepRow("s", "generated pointwise", ["s"], [1.0])], [1.0], lines)
    text = format_profile(profile.to_json()).splitlines()
    assert text[-3:] == ["steps left apart (a value one step makes and another reads, and why they are not one "
                         "kernel):", f"  {lines[0]}", f"  {lines[1]}"]
    assert lines[0].startswith("step 0 (generated pointwise: ") and " -> step 1 (aten topk: " in lines[0]
