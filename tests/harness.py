"""The one test harness: compile -> run -> compare with eager -> check engine/torch block counts."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.partitioning.report import PartitionReport

FP32_RTOL = 1e-4  # max abs error <= FP32_RTOL * max|reference|
# The backend check_compiled compiles for when a test names none; conftest sets it from `pytest --backend`.
# None: compile's own default ("auto": onnxruntime on the CPU).
DEFAULT_BACKEND: str | None = None


def assert_matches_eager(out: Any, ref: Any, rtol: float = FP32_RTOL, path: str = "output",
                         min_cosine: float | None = None) -> None:
    """Tensors: the same NaN and infinities (with their signs) and max abs error <= rtol * max|ref| (exact for
    integers and bools), and with `min_cosine` (half precision) a cosine similarity at least that; collections
    recursively."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(out, torch.Tensor), f"{path}: expected a tensor, got {type(out).__name__}"
        assert out.shape == ref.shape, f"{path}: shape {tuple(out.shape)} != eager {tuple(ref.shape)}"
        assert out.dtype == ref.dtype, f"{path}: dtype {out.dtype} != eager {ref.dtype}"
        assert out.device == ref.device, f"{path}: device {out.device} != eager {ref.device}"
        if not ref.dtype.is_floating_point:
            assert torch.equal(out, ref), f"{path}: integer/bool values differ from eager"
            return
        finite = torch.isfinite(ref)
        special = (finite != out.isfinite()) | (ref.isnan() != out.isnan()) | (ref.isinf() & (out != ref))
        if special.any():
            at = tuple(special.nonzero()[0].tolist())
            raise AssertionError(f"{path}: {out[at].item()} at {at} where eager gives {ref[at].item()} (NaN and "
                                 f"infinities must match eager's)")
        if not finite.any():
            return
        err = (out[finite].double() - ref[finite].double()).abs().max().item()
        scale = ref[finite].double().abs().max().item()
        assert err <= rtol * scale or err <= 1e-7, (
            f"{path}: max abs error {err:.3e} > {rtol:g} x max|ref| {scale:.3e}")
        if min_cosine is not None:
            cosine = torch.nn.functional.cosine_similarity(out[finite].double(), ref[finite].double(), dim=0).item()
            assert cosine >= min_cosine, f"{path}: cosine similarity {cosine:.6f} < {min_cosine}"
    elif isinstance(ref, (tuple, list)):
        assert type(out) is type(ref) and len(out) == len(ref), f"{path}: {type(out)} != eager {type(ref)}"
        for i, (o, r) in enumerate(zip(out, ref)):
            assert_matches_eager(o, r, rtol, f"{path}[{i}]", min_cosine)
    elif isinstance(ref, dict):
        assert isinstance(out, dict) and set(out) == set(ref), f"{path}: keys differ from eager"
        for k in ref:
            assert_matches_eager(out[k], ref[k], rtol, f"{path}[{k!r}]", min_cosine)
    else:
        assert out == ref, f"{path}: {out!r} != eager {ref!r}"


def check_compiled(
    model: torch.nn.Module,
    example: Sequence[torch.Tensor],
    *,
    inputs: Sequence[Any] | None = None,
    engines: int | None = 1,
    torch_blocks: int | None = 0,
    rtol: float = FP32_RTOL,
    min_cosine: float | None = None,
    op: str | None = None,
    backend: str | None = None,
    **settings: Any,
) -> tuple[torch.jit.ScriptModule, PartitionReport]:
    """Compile `model` for `example` on `backend` (None: DEFAULT_BACKEND), assert it matches eager and has the
    expected blocks (and that `op`, if given, ran in an engine)."""
    backend = backend or DEFAULT_BACKEND
    if backend is not None:
        settings["backend"] = backend
    model = model.eval()
    with torch.no_grad():
        ref = model(*example)
    specs = inputs if inputs is not None else [torchkiln.Input.from_tensor(t) for t in example]
    compiled, report = compile_with_report(model, specs, **settings)
    with torch.no_grad():
        out = compiled(*example)
    assert_matches_eager(out, ref, rtol, min_cosine=min_cosine)
    if engines is not None:
        assert report.num_engine_blocks == engines, f"expected {engines} engine blocks:\n{report}"
    if torch_blocks is not None:
        assert report.num_torch_blocks == torch_blocks, f"expected {torch_blocks} torch blocks:\n{report}"
    if op is not None:
        assert_converted(report, op)
    return compiled, report


def check_fn(fn: Any, *example: torch.Tensor, **kwargs: Any) -> tuple[torch.jit.ScriptModule, PartitionReport]:
    """check_compiled for a named function of 1-4 tensors, scripted inside a module; min_block_size=1.

    The module is scripted here, so a function that only traces fails instead of testing another graph.
    """
    kwargs.setdefault("min_block_size", 1)
    return check_compiled(torch.jit.script(wrap(fn, len(example))), example, **kwargs)


def check_traced(fn: Callable[..., Any], *example: torch.Tensor, **kwargs: Any
                 ) -> tuple[torch.jit.ScriptModule, PartitionReport]:
    """check_compiled for any callable (a lambda, a module), traced on `example`; min_block_size=1."""
    kwargs.setdefault("min_block_size", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(Traced(fn).eval(), example, check_trace=False)
    return check_compiled(traced, example, **kwargs)


class Traced(torch.nn.Module):
    """A module whose forward is `fn(*inputs)` (for tracing: tensors `fn` captures become constants)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.fn(*inputs)


def assert_converted(report: PartitionReport, op: str) -> None:
    engine_ops = {o for b in report.blocks if b.target == "engine" for o in b.ops}
    assert op in engine_ops, f"{op} did not run in an engine:\n{report}"


def assert_falls_back(report: PartitionReport, op: str, reason: str) -> None:
    """`op` stayed in PyTorch, and its fallback detail mentions `reason`."""
    details = [f.detail for b in report.blocks for f in b.fallback if f.op == op]
    assert details, f"{op} did not fall back:\n{report}"
    assert any(reason in d for d in details), f"{op} fell back for another reason: {details}"


def wrap(fn: Any, arity: int) -> torch.nn.Module:
    """A module whose forward(x[, y[, z[, w]]]) returns fn(...); TorchScript compiles `fn` with it."""
    if arity == 1:
        class Fn1(torch.nn.Module):
            def forward(self, x: torch.Tensor):
                return fn(x)
        return Fn1()
    if arity == 2:
        class Fn2(torch.nn.Module):
            def forward(self, x: torch.Tensor, y: torch.Tensor):
                return fn(x, y)
        return Fn2()
    if arity == 3:
        class Fn3(torch.nn.Module):
            def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor):
                return fn(x, y, z)
        return Fn3()
    if arity == 4:
        class Fn4(torch.nn.Module):
            def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor):
                return fn(x, y, z, w)
        return Fn4()
    raise ValueError(f"wrap supports 1 to 4 inputs, got {arity}")


def run_plan_eagerly(network: Any, plan: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A CUDA plan's steps bound to `inputs`' shapes and run one by one on their device (on the CPU, generated
    kernels run in Triton's interpreter)."""
    from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights
    from torchkiln.runtime.symbols import SymbolBinder

    device = inputs[0].device
    bound = bind_steps(network, plan, place_weights(network, plan, device), SymbolBinder.for_network(network),
                       [tuple(x.shape) for x in inputs], device, allow_tf32=False)
    return bound.run_eagerly(list(inputs))


def tiny_bert() -> torch.nn.Module:
    """A transformers BERT of 2 layers, hidden 64, vocabulary 1000 (positions up to 64), random weights, in eval
    mode; skips the test where transformers is not installed."""
    import pytest

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def sole_engine(module: torch.jit.ScriptModule) -> Any:
    """The one engine of a compiled module, deserialized."""
    from torchkiln.runtime.engine import Engine
    from torchkiln.stitching.stitch import engine_attrs

    [attr] = engine_attrs(module)
    return Engine.deserialize(getattr(module, attr).numpy().tobytes())


def session_graph(module: torch.jit.ScriptModule, inputs: Sequence[torch.Tensor], folder: str) -> list[Any]:
    """The nodes of the graph ONNX Runtime runs for the one engine of a compiled module (its onnxruntime backend's
    sessions, in order, as ORT optimized them: written by their profiling into `folder`), after one call."""
    import onnx

    from torchkiln.runtime.backends.onnxruntime import OrtRunner

    engine = sole_engine(module)
    cpu = torch.device("cpu")
    runner = OrtRunner(engine.network, engine.plan_for(cpu), cpu, engine.run_options, folder)
    runner.run(list(inputs))
    return [node for _, model in runner.end_profiling()
            for node in onnx.load(model, load_external_data=False).graph.node]


class WhileLoop(torch.nn.Module):
    """Halve until the norm is below 1: the trip count depends on the data."""

    def forward(self, x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        y = x * 1.0
        while y.abs().sum() > 1.0:
            y = y * 0.5 + step
        return y + 1.0


class Endless(torch.nn.Module):
    """A while loop no finite input ends."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.0
        while bool((y == y).all()):
            y = y + 1.0
        return y


class LongFor(torch.nn.Module):
    """1000 iterations carrying a tensor: too many to unroll."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(1000):
            h = torch.tanh(h * 0.9 + w)
        return h
