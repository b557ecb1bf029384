"""The peers torchkiln is compared with, each a way to run one model on fixed inputs: eager PyTorch, eager
captured in a CUDA graph, torch.compile (default, "reduce-overhead", "reduce-overhead" with Inductor's freezing),
ONNX Runtime run directly on `torch.onnx.export`'s graph (on the CPU), and torchkiln itself (and its own ONNX
Runtime session run alone). Each builder returns a callable of no arguments that runs the model on the inputs;
building includes the compile and the first call (torch.compile compiles at its first call)."""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

import torch

from torchkiln.compiler import compile as torchkiln_compile, compile_with_report
from torchkiln.settings import Input

Runner = Callable[[], torch.Tensor]


def eager(model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype) -> Runner:
    return lambda: model(*inputs)


def eager_cuda_graph(model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype) -> Runner:
    """Eager captured once in a CUDA graph (warmed up on a side stream first, as capture requires); a call
    replays it on the same input buffers."""
    if inputs[0].device.type != "cuda":
        raise RuntimeError(f"CUDA graphs need a CUDA device, not {inputs[0].device}")
    static = [x.clone() for x in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")  # a host sync (.item(), nonzero) cannot be captured: fail here,
        try:  # before a capture that fails half-way leaves the CUDA context unusable
            model(*static)
        except RuntimeError as e:
            raise RuntimeError(f"the model synchronizes with the host, which a CUDA graph cannot capture ({e})") \
                from None
        finally:
            torch.cuda.set_sync_debug_mode(mode)
        for _ in range(2):
            model(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(*static)

    def replay() -> torch.Tensor:
        graph.replay()
        return out
    return replay


def _torch_compile(model: torch.nn.Module, inputs: Sequence[torch.Tensor], mode: str | None,
                   freezing: bool = False) -> Runner:
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()  # no reuse of another peer's compiled code for the same forward
    compiled = torch.compile(model, mode=mode)
    with torch._inductor.config.patch(freezing=freezing):
        compiled(*inputs)  # compiles now, under the setting
    if mode == "reduce-overhead":
        def call() -> torch.Tensor:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*inputs)
        return call
    return lambda: compiled(*inputs)


def compile_default(model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype) -> Runner:
    return _torch_compile(model, inputs, None)


def compile_reduce_overhead(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                            precision: torch.dtype) -> Runner:
    return _torch_compile(model, inputs, "reduce-overhead")


def compile_reduce_overhead_freezing(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                                     precision: torch.dtype) -> Runner:
    return _torch_compile(model, inputs, "reduce-overhead", freezing=True)


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """File descriptor 1 to /dev/null meanwhile (what C++ code writes too)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def ort_direct(model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype) -> Runner:
    """What a user who can export to ONNX gets without torchkiln: `torch.onnx.export` (TorchScript exporter, its
    constant folding on) run in an ONNX Runtime CPU session with every graph optimization, on as many intra-op
    threads as torch uses (the threads torchkiln's sessions get), inputs and outputs as numpy views."""
    import io

    import onnxruntime

    if any(x.device.type != "cpu" for x in inputs):
        raise RuntimeError(f"ort-direct runs on the CPU, not on {inputs[0].device}")
    buffer = io.BytesIO()
    with _stdout_silenced():  # where it fails, the exporter prints the whole graph (from C++)
        torch.onnx.export(model, tuple(inputs), buffer, dynamo=False, opset_version=17)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(inputs):  # the export drops inputs the graph does not read
        raise RuntimeError(f"the exported graph takes {len(names)} of the model's {len(inputs)} inputs")
    feeds = {name: x.detach().contiguous().numpy() for name, x in zip(names, inputs)}
    first = [session.get_outputs()[0].name]
    return lambda: torch.from_numpy(session.run(first, feeds)[0])


def torchkiln(model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype) -> Runner:
    """torchkiln.compile for Inputs of the inputs' shapes and dtypes; shape analysis (and tracing, where the model
    cannot be scripted) runs on the inputs themselves, so that a traced data-dependent branch (transformers'
    "is the attention mask all ones") is the one these inputs take."""
    specs = [Input.from_tensor(x) for x in inputs]
    compiled, report = compile_with_report(model, inputs=specs, enabled_precisions={precision},
                                           device=inputs[0].device)
    compiled(*inputs)

    def run():
        return compiled(*inputs)

    run.blocks = {"engine": report.num_engine_blocks, "torch": report.num_torch_blocks}  # the partition, in the row
    if report.num_torch_blocks:  # what a split left to PyTorch, and why (the report's first reason for each op)
        reasons: dict[str, str] = {}
        for f in (f for b in report.blocks for f in b.fallback):
            reasons.setdefault(f.op, f.reason.value + (f": {f.detail}" if f.detail and f.detail != f.op else ""))
        run.blocks["in_pytorch"] = [f"{op} x{count} ({reasons[op][:160]})"
                                    for op, count in sorted(report.fallback_ops.items(), key=lambda kv: -kv[1])]
    return run


def torchkiln_session(model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype) -> Runner:
    """torchkiln's own ONNX Runtime session called directly (`session.run` on numpy views of the inputs), where the
    model compiles to one engine of one session: against "ort-direct", what torchkiln's graph gains; against
    "torchkiln", what the compiled module's call path costs."""
    from torchkiln.runtime.backends.onnxruntime import _Session
    from torchkiln.runtime.execute_op import engine_from_blob
    from torchkiln.stitching.stitch import engine_attrs

    specs = [Input.from_tensor(x) for x in inputs]
    compiled = torchkiln_compile(model, inputs=specs, enabled_precisions={precision}, device=inputs[0].device)
    attrs = engine_attrs(compiled)
    steps = engine_from_blob(getattr(compiled, attrs[0])).runner(inputs[0].device).steps if len(attrs) == 1 else []
    if len(steps) != 1 or not isinstance(steps[0][0], _Session):
        raise RuntimeError("the model did not compile to one engine of one ONNX Runtime session")
    step = steps[0][0]
    feeds = {name: x.detach().contiguous().numpy() for name, x in zip(step.input_names, inputs)}
    names = step.output_names[:1]
    return lambda: torch.from_numpy(step.session.run(names, feeds)[0])


PEERS: dict[str, Callable[[torch.nn.Module, Sequence[torch.Tensor], torch.dtype], Runner]] = {
    "eager": eager,
    "eager+cudagraph": eager_cuda_graph,
    "compile": compile_default,
    "compile-ro": compile_reduce_overhead,
    "compile-ro-freeze": compile_reduce_overhead_freezing,
    "ort-direct": ort_direct,
    "torchkiln-session": torchkiln_session,
    "torchkiln": torchkiln,
    "torchkiln-warm": torchkiln,  # built again after "torchkiln": the rebuild with warm timing and kernel caches
}
BEST_PEER_CANDIDATES = {  # by device type: the "best peer" is the fastest of these that ran
    "cuda": ("eager+cudagraph", "compile-ro", "compile-ro-freeze"),
    "cpu": ("ort-direct", "compile"),
}
DEFAULT_PEERS = {  # by device type: the peers a run compares unless told otherwise
    "cuda": ("eager", "eager+cudagraph", "compile", "compile-ro", "compile-ro-freeze", "torchkiln", "torchkiln-warm"),
    "cpu": ("eager", "ort-direct", "torchkiln-session", "torchkiln"),
}

