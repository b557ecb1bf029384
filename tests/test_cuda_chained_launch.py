"""Chained launches (codegen.chained): every generated kernel waits for the kernel before it before it reads or writes
anything, the runner chains only a generated step that follows another, and on a GPU that chains (Hopper and later)
a chained plan computes exactly what an unchained one does. Triton's interpreter cannot run the wait, so on the CPU
the sources and the links are checked, and the GPU test runs both ways."""
import re

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.ir.tensor import Tensor  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import codegen, planner, runner  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen import (PDL_PARAM, WAIT_LINES, captured_later,  # noqa: E402
                                                     chain_options, chained, chains, chains_steps, depthwise, gemm,
                                                     indexed, pointwise, pooling, reduction)
from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights  # noqa: E402
from torchkiln.runtime.symbols import SymbolBinder  # noqa: E402

F16 = torch.float16


def chain_network() -> Network:
    """softmax (a row kernel) -> concatenation with the input and a product (an indexed kernel) -> a matrix product
    (a library call) -> softmax (a row kernel)."""
    net = Network("chain")
    x = net.add_input("x", torch.float32, (4, 16, 32))
    s = net.add_softmax(x, 2).get_output()
    c = net.add_concatenation([s, x], 2).get_output()
    r = net.add_elementwise(c, c, L.ElementWiseOperation.PROD).get_output()
    g = torch.Generator().manual_seed(0)
    w = net.add_constant(torch.randn(64, 24, generator=g) / 8).get_output()
    p = net.add_matrix_multiply(r, L.MatrixOperation.NONE, w, L.MatrixOperation.NONE).get_output()
    net.mark_output(net.add_softmax(p, 2).get_output())
    return net


def kernels_of(source: str) -> list[tuple[list[str], list[str]]]:
    """Each kernel of `source` (a `@triton.jit` function named *kernel*, not a combining function): its parameters
    and its body's lines."""
    found = []
    for match in re.finditer(r"@triton\.jit[^\n]*\ndef \w*kernel\w*\((.*?)\):\n(.*?)(?=\n@triton|\Z)", source, re.S):
        params = [p.strip() for p in match.group(1).split(",") if p.strip()]
        body = [line[4:] for line in match.group(2).splitlines() if line.strip() and not line.strip().startswith("#")]
        found.append((params, body))
    return found


def sources() -> dict[str, str]:
    """One generated kernel source of each generator."""
    x = Tensor("x", (2, 8, 6, 6), F16)
    y = Tensor("y", (2, 8, 6, 6), F16)
    relu = L.ActivationLayer(name="relu", inputs=[x], outputs=[y], weights={}, type=L.ActivationType.RELU)
    xt = Tensor("xt", (2, 6, 6, 8), F16)
    shuffle = L.ShuffleLayer(name="shuffle", inputs=[x], outputs=[xt], weights={}, first_transpose=(0, 2, 3, 1))
    rows = Network("rows")
    r = rows.add_input("r", torch.float32, (3, 40))
    rows.mark_output(rows.add_softmax(r, 1).get_output())
    a = Tensor("a", (2, 19, 40), F16)
    w = Tensor("w", (36, 40), F16)
    product = Tensor("p", (2, 19, 36), F16)
    mm = L.MatrixMultiplyLayer(name="mm", inputs=[a, w], outputs=[product], weights={},
                               op0=L.MatrixOperation.NONE, op1=L.MatrixOperation.TRANSPOSE)
    convs = Network("dw")
    c = convs.add_input("c", F16, (2, 8, 6, 6))
    dw = convs.add_convolution_nd(c, torch.randn(8, 1, 3, 3).half(), None, stride=(1, 1), padding=(1, 1),
                                  dilation=(1, 1), groups=8)
    return {"pointwise": pointwise.generate([relu], [x], [y]).source,
            "indexed": indexed.generate([shuffle], [x], [xt]).source,
            "reduction": reduction.generate(rows.layers, rows.inputs, rows.outputs).source,
            "gemm": gemm.generate(mm, [], [], [product]).source,
            "depthwise": depthwise.generate(dw, [], [], [dw.outputs[0]]).source,
            "pooling": pooling.SOURCE}


@pytest.mark.parametrize("kind", ["pointwise", "indexed", "reduction", "gemm", "depthwise", "pooling"])
def test_every_generated_kernel_waits_for_the_kernel_before_it_before_anything_else(kind):
    found = kernels_of(sources()[kind])
    assert found, kind
    for params, body in found:
        assert params[-1] == PDL_PARAM, params
        assert body[:len(WAIT_LINES)] == list(WAIT_LINES), body[:3]


def test_launches_are_chained_only_inside_chained():
    assert chain_options() == {}
    with chained(True):
        assert chain_options() == {"PDL": True, "launch_pdl": True}
        with chained(False):
            assert chain_options() == {}
        assert chain_options() == {"PDL": True, "launch_pdl": True}
    assert chain_options() == {}
    assert not chains(torch.device("cpu"))


def test_only_a_generated_step_after_a_generated_step_is_linked():
    net = chain_network()
    plan = planner.make_plan(net, torch.device("cpu"), BackendOptions(timing_iterations=0))
    kinds = [(plan.kernels[s.kernel].kind, plan.kernels[s.kernel].op) for s in plan.steps]
    assert kinds == [("aten", "constant"), ("generated", "rows"), ("generated", "indexed"),
                     ("library", "matrix_multiply"), ("generated", "rows")], kinds
    cpu = torch.device("cpu")
    weights = place_weights(net, plan, cpu)
    binder = SymbolBinder.for_network(net)
    linked = bind_steps(net, plan, weights, binder, [(4, 16, 32)], cpu, False, chain=True)
    assert linked.links == {2}  # the indexed step after the row step; not a row step after a constant or a product
    assert bind_steps(net, plan, weights, binder, [(4, 16, 32)], cpu, False).links == frozenset()


def test_steps_are_chained_where_captured_or_recorded_for_a_capture(monkeypatch):
    """A runner chains its steps inside its own graphs, and uncaptured only where its run is recorded for a runtime
    that captures it (a tape's: `captured_later`); never on a GPU that does not chain."""
    gpu = torch.device("cuda")
    monkeypatch.setattr(codegen, "chains", lambda device: True)  # a GPU that chains (none here)
    assert chains_steps(gpu, True) and not chains_steps(gpu, False)
    with captured_later():
        assert chains_steps(gpu, False) and chains_steps(gpu, True)
    assert not chains_steps(gpu, False)
    monkeypatch.setattr(codegen, "chains", lambda device: False)
    with captured_later():
        assert not chains_steps(gpu, True) and not chains_steps(gpu, False)


@pytest.mark.skipif(not torch.cuda.is_available() or not chains(torch.device("cuda")),
                    reason="needs a GPU that chains launches (compute capability 9.0 or later)")
def test_a_chained_plan_computes_what_an_unchained_one_does(monkeypatch):
    net = chain_network()
    device = torch.device("cuda")
    options = BackendOptions(timing_iterations=0)
    plan = planner.make_plan(net, device, options)
    x = torch.randn(4, 16, 32, device=device)
    chained_runner = runner.CudaRunner(net, plan, device, options)
    got = [chained_runner.run([x])[0].clone() for _ in range(3)]  # eager, captured, replayed
    assert any(b.links for b in chained_runner._bound.values())
    monkeypatch.setattr(codegen, "chains", lambda device: False)
    plain = runner.CudaRunner(net, plan, device, options)
    want = [plain.run([x])[0].clone() for _ in range(3)]
    assert not any(b.links for b in plain._bound.values())
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    ref = torch.softmax(torch.cat([torch.softmax(x, 2), x], 2) ** 2 @ net.layers[3].weights["value"].to(device), 2)
    assert (got[-1] - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_the_runners_dry_run_compiles_the_chained_variants_its_first_run_launches(monkeypatch):
    """Tactic candidates compile unchained only (`timing.first_calls`); the chained variant of a step after a generated
    step is compiled by the runner's dry run (`_Bound.compile_ahead`), which launches each step as its first run will:
    chained where linked."""
    from torchkiln.runtime.backends.cuda.timing import first_calls

    seen = []
    assert first_calls([lambda: seen.append(chain_options())]) == [None]
    assert seen == [{}, {}]  # (its compiling pass and its first call)
    net = chain_network()
    cpu = torch.device("cpu")
    plan = planner.make_plan(net, cpu, BackendOptions(timing_iterations=0))
    weights = place_weights(net, plan, cpu)
    bound = bind_steps(net, plan, weights, SymbolBinder.for_network(net), [(4, 16, 32)], cpu, False, chain=True)
    queued = []
    real_launch = codegen.launch

    def noting(kernel, grid, *args, **meta):
        queued.append((codegen.is_compiling_ahead(), bool(meta.get("PDL"))))
        real_launch(kernel, grid, *args, **meta)

    for module in (reduction, indexed):
        monkeypatch.setattr(module, "launch", noting)
    bound.compile_ahead([torch.randn(4, 16, 32)])
    assert queued == [(True, False), (True, True), (True, False)]  # rows; indexed (linked); rows after the product
