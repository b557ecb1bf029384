"""The CUDA backend on a GPU: fused plans, CUDA graphs per shape, outputs that stay the caller's, threads and
streams, dynamic shapes, the timing cache (skipped where there is no GPU; run on the GPU machine)."""
import json
import threading

import pytest
import torch

import torchkiln
from torchkiln.examples import MLP, SmallResNet
from torchkiln.runtime.backends.cuda import runner as cuda_runner
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.stitching.stitch import ENGINE_ATTR

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _true_fp32():
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


def _engine(compiled, k=0):
    return engine_from_blob(getattr(compiled, ENGINE_ATTR.format(k)))


# No tape: every call runs on the package's runner, whose graphs and tails these tests inspect (a C++ runtime library
# hosted by this process would take the calls a tape fits: docs/deployment.md).
PACKAGE_RUNNER = {"native_tape": False}


def _close(out, ref, fp16=False):
    ref = ref.float()
    if fp16:
        cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
        assert cos >= 0.999 and (out.float() - ref).abs().max() <= 2e-2 * ref.abs().max()
    else:
        assert (out - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.fixture(scope="module")
def resnet():
    return SmallResNet().eval().cuda()


def test_fp32_engine_on_the_cuda_backend_matches_eager_and_replays_a_graph(resnet):
    x = torch.randn(2, 3, 64, 64, device="cuda")
    compiled = torchkiln.compile(resnet, [torchkiln.Input(x.shape)], backend="cuda", **PACKAGE_RUNNER)
    engine = _engine(compiled)
    assert engine.backend == "cuda"
    ref = resnet(x)
    for _ in range(3):  # the first call captures; later ones replay
        _close(compiled(x), ref)
    run = engine.runner(x.device)
    assert any(b.graph is not None for b in run._bound.values())


def test_fp16_plan_fuses_residual_blocks_and_matches(resnet):
    x = torch.randn(4, 3, 64, 64, device="cuda")
    compiled = torchkiln.compile(resnet, [torchkiln.Input(x.shape)], enabled_precisions={torch.float16})
    plan = _engine(compiled).plans[0]
    assert plan.target.device_name == torch.cuda.get_device_name()
    assert {"conv_add_relu", "conv_relu"} & {k.op for k in plan.kernels}
    ref = resnet(x)
    for _ in range(2):
        _close(compiled(x), ref, fp16=True)


def test_an_output_is_never_overwritten_by_a_later_call(resnet):
    compiled = torchkiln.compile(resnet, [torchkiln.Input((1, 3, 32, 32))])
    xs = [torch.randn(1, 3, 32, 32, device="cuda") for _ in range(4)]
    outs = [compiled(x) for x in xs]
    for x, out in zip(xs, outs):
        _close(out, resnet(x))


class _Wide(torch.nn.Module):
    """Outputs of 8 MB (a tail graph hands them out) from a matrix multiply and its epilogue."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(256, 2048) / 16)

    def forward(self, x):
        return torch.relu(x @ self.w) * 2 + 1


def test_large_outputs_are_handed_out_without_a_copy_and_never_overwritten():
    model = _Wide().eval().cuda()
    compiled = torchkiln.compile(model, [torchkiln.Input((1024, 256))], **PACKAGE_RUNNER)
    xs = [torch.randn(1024, 256, device="cuda") for _ in range(6)]
    refs = [model(x) for x in xs]
    kept = [compiled(x) for x in xs]  # every output held: two tails, then the last steps uncaptured
    for out, ref in zip(kept, refs):
        _close(out, ref)
    [bound] = _engine(compiled).runner(xs[0].device)._bound.values()
    assert bound.handoff is not None and len(bound.tails) == cuda_runner.TAILS
    del kept
    tail_memory = {t.outputs[0].data_ptr() for t in bound.tails}
    out = None
    for x, ref in zip(xs, refs):  # the last call's output held while calling again: the tails alternate
        out = compiled(x)
        _close(out, ref)
        assert out.data_ptr() in tail_memory  # handed out, not copied
    view = compiled(xs[0])[:3]  # a view alone holds the output
    changed = compiled(xs[1])
    changed.add_(100.0)  # the caller's own memory to change
    del changed
    for x, ref in zip(xs[2:], refs[2:]):
        _close(compiled(x), ref)
    _close(view, refs[0][:3])


def test_a_tail_output_still_read_on_its_stream_is_not_overwritten_by_a_call_on_another():
    """A caller reads an output on its stream, lets it go and calls again on another stream (pipelined serving):
    the tail is free again, but its replay waits for the work queued on the first stream, where the copy below,
    held back by a sleep, still reads the first call's output."""
    model = _Wide().eval().cuda()
    compiled = torchkiln.compile(model, [torchkiln.Input((1024, 256))], **PACKAGE_RUNNER)
    xs = [torch.randn(1024, 256, device="cuda") for _ in range(2)]
    refs = [model(x) for x in xs]
    for _ in range(2):  # the first call captures the tail, the second replays it; neither output is kept
        compiled(xs[0])
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(first):
        out = compiled(xs[0])
        torch.cuda._sleep(200_000_000)  # about 0.1 s of the first stream's time before the copy
        copy = out.clone()
        del out
    with torch.cuda.stream(second):
        other = compiled(xs[1])
    torch.cuda.synchronize()
    [bound] = _engine(compiled).runner(xs[0].device)._bound.values()
    assert len(bound.tails) == 1  # both calls replayed the one tail
    _close(copy, refs[0])
    _close(other, refs[1])


@pytest.mark.parametrize("build", [_Wide, None], ids=["tails", "one-graph"])
def test_a_graph_captured_under_inference_mode_serves_calls_outside_it(build, resnet):
    """The first call (the capture) under torch.inference_mode, later ones outside it: the graph's input buffers and
    the outputs a tail hands out are normal tensors (a later call copies into the one, a caller changes the other in
    place)."""
    model = build().eval().cuda() if build else resnet
    shape = (1024, 256) if build else (2, 3, 32, 32)
    compiled = torchkiln.compile(model, [torchkiln.Input(shape)])
    xs = [torch.randn(shape, device="cuda") for _ in range(3)]
    with torch.inference_mode():
        compiled(xs[0])
        compiled(xs[0])
    for x in xs:
        out = compiled(x)
        _close(out, model(x))
        out.add_(1.0)


def test_small_outputs_are_copied_out_of_one_graph(resnet):
    compiled = torchkiln.compile(resnet, [torchkiln.Input((2, 3, 32, 32))], **PACKAGE_RUNNER)
    x = torch.randn(2, 3, 32, 32, device="cuda")
    for _ in range(3):
        _close(compiled(x), resnet(x))
    [bound] = _engine(compiled).runner(x.device)._bound.values()
    assert bound.graph is not None and bound.handoff is None and not bound.tails


def test_threads_on_their_own_streams_get_their_own_results(resnet):
    compiled = torchkiln.compile(resnet, [torchkiln.Input((2, 3, 32, 32))])
    xs = [torch.randn(2, 3, 32, 32, device="cuda") for _ in range(4)]
    refs = [resnet(x) for x in xs]
    compiled(xs[0])
    results: dict[int, list] = {}

    def work(i):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            results[i] = [compiled(xs[i]) for _ in range(20)]
        stream.synchronize()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for out in results[i]:
            _close(out, refs[i])



def test_engines_first_called_from_several_threads_at_once_all_capture(resnet, caplog):
    """Four engines' first calls (an uncaptured run, then the capture) at once from four threads, each on its own
    stream: every engine captures its graph and every result is eager's. Captured in CUDA's global mode, one thread's
    capture refused the others' first calls (cuBLAS's handle) and failed itself (capture.py)."""
    shapes = [(1, 3, 32, 32), (2, 3, 32, 32), (3, 3, 40, 40), (4, 3, 24, 24)]
    compiled = [torchkiln.compile(resnet, [torchkiln.Input(s)], **PACKAGE_RUNNER) for s in shapes]
    xs = [torch.randn(s, device="cuda") for s in shapes]
    refs = [resnet(x) for x in xs]
    results: dict[int, list] = {}
    errors = []

    def work(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                results[i] = [compiled[i](xs[i]) for _ in range(10)]
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    with caplog.at_level("WARNING", logger="torchkiln"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert "capture failed" not in caplog.text
    for i in range(4):
        [bound] = _engine(compiled[i]).runner(xs[i].device)._bound.values()
        assert bound.captured
        for out in results[i]:
            _close(out, refs[i])

def test_dynamic_batch_captures_per_shape_in_a_bounded_set(monkeypatch):
    monkeypatch.setattr(cuda_runner, "MAX_GRAPHS", 2)
    model = MLP().eval().cuda()
    compiled = torchkiln.compile(model, [torchkiln.Input(min_shape=(1, 64), opt_shape=(4, 64), max_shape=(8, 64))])
    for b in (1, 8, 3, 1, 5, 8):
        x = torch.randn(b, 64, device="cuda")
        _close(compiled(x), model(x))
    bound = _engine(compiled).runner(x.device)._bound  # the runner the calls used (keyed by cuda:N)
    assert 1 <= len(bound) <= 2
    with pytest.raises(torchkiln.EngineInputError, match="dim 0 is 9, outside the range"):
        compiled(torch.randn(9, 64, device="cuda"))


def test_saved_module_reloads_with_its_plan(resnet, tmp_path):
    x = torch.randn(1, 3, 32, 32, device="cuda")
    torch.jit.save(torchkiln.compile(resnet, [torchkiln.Input(x.shape)], enabled_precisions={torch.float16}),
                   tmp_path / "m.ts")
    loaded = torchkiln.load(tmp_path / "m.ts")
    assert len(_engine(loaded).plans) == 1
    _close(loaded(x), resnet(x), fp16=True)
    assert len(_engine(loaded).plans) == 1  # the stored plan fit this GPU: nothing replanned


def test_timing_cache_makes_the_second_build_time_nothing(resnet, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHKILN_CACHE_DIR", str(tmp_path))
    inputs = [torchkiln.Input((2, 3, 32, 32))]
    torchkiln.compile(resnet, inputs, enabled_precisions={torch.float16})
    entries = json.loads((tmp_path / "timing.json").read_text())
    convolutions = {v for k, v in entries.items() if '"gemm"' not in k}
    assert convolutions and convolutions <= {"fused", "unfused"}
    before = (tmp_path / "timing.json").stat().st_mtime_ns
    torchkiln.compile(resnet, inputs, enabled_precisions={torch.float16})
    assert (tmp_path / "timing.json").stat().st_mtime_ns == before


class _MaskedAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x, keep):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        mask = (1.0 - keep[:, None, None, :].to(x.dtype)) * -10000.0  # BERT's additive padding mask
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_attention_runs_through_the_backend_timed_fastest(tmp_path, monkeypatch):
    """SDPA's backends and the generated kernel's tiles compete; the fastest runs, with SDPA's values."""
    from torchkiln.runtime.backends.cuda.codegen.attention import CONFIGS

    monkeypatch.setenv("TORCHKILN_CACHE_DIR", str(tmp_path))
    model = _MaskedAttention().eval().cuda()
    x = torch.randn(2, 32, 64, device="cuda")
    keep = torch.ones(2, 32, dtype=torch.int64, device="cuda")
    keep[1, 20:] = 0
    compiled = torchkiln.compile(model, [torchkiln.Input(x.shape), torchkiln.Input(keep.shape, dtype=torch.int64)],
                                 enabled_precisions={torch.float16})
    [kernel] = [k for k in _engine(compiled).plans[0].kernels if k.op == "attention"]
    assert kernel.option("backend") in {"cudnn", "efficient", "flash", "math"} or kernel.option("config") in CONFIGS
    assert "attention" in (tmp_path / "timing.json").read_text()
    _close(compiled(x, keep), model(x, keep), fp16=True)


def test_operands_strided_along_their_last_dim_run_on_a_fused_backend(caplog):
    """A position bias permuted from [L, S, heads] (T5's) is strided along the keys, a value viewed channels-first
    out of its projection (cross-covariance attention's [B, heads, d, tokens]) along its last dim; the fused
    backends refused them and only the math backend ran (fp32 scores). Now no refusal is logged and the values
    match."""
    from torchkiln.runtime.backends.cuda.timing import sdpa

    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.randn(64, 64, 4, device="cuda", dtype=torch.float16).permute(2, 0, 1)[None].expand(2, 4, 64, 64)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    with caplog.at_level("INFO", logger="torchkiln"):
        _close(sdpa("efficient", False, None)(q, k, v, mask), ref, fp16=True)
    assert "refuses these inputs" not in caplog.text
    qkv = torch.randn(2, 40, 3, 4, 16, device="cuda", dtype=torch.float16).permute(2, 0, 3, 4, 1)  # [3, B, h, d, N]
    q, k, v = qkv.unbind(0)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    with caplog.at_level("INFO", logger="torchkiln"):
        _close(sdpa("flash", False, None)(q, k, v, None), ref, fp16=True)
    assert v.stride(-1) != 1 and "refuses these inputs" not in caplog.text


def test_a_backend_refusing_a_calls_inputs_gives_way_to_pytorchs_choice():
    """The build times backends on contiguous inputs; a call's may be laid out otherwise (a mask expanded over the
    batch) and refused by the chosen backend: PyTorch's own choice runs them (flash never takes a mask)."""
    from torchkiln.runtime.backends.cuda.timing import sdpa

    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.randn(1, 4, 64, 64, device="cuda", dtype=torch.float16).expand(2, 4, 64, 64)
    run = sdpa("flash", False, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    for _ in range(2):  # the refusal, then the remembered fallback
        _close(run(q, k, v, mask), ref, fp16=True)


class _DilatedDepthwise(torch.nn.Module):
    """MobileNetV3's dilated tail: a 5x5 depthwise convolution of dilation 2 (then hardswish) between pointwise
    convolutions."""

    def __init__(self, c=96):
        super().__init__()
        self.expand = torch.nn.Conv2d(32, c, 1)
        self.depthwise = torch.nn.Conv2d(c, c, 5, padding=4, dilation=2, groups=c)
        self.project = torch.nn.Conv2d(c, 32, 1)

    def forward(self, x):
        return self.project(torch.nn.functional.hardswish(self.depthwise(torch.relu(self.expand(x)))))


def test_a_depthwise_convolution_runs_in_the_layout_timed_faster(tmp_path, monkeypatch):
    """The build times the depthwise convolution channels-last and NCHW (with the conversions); either way the
    result matches eager, and the choice is in the timing cache. (The cuDNN step it chooses may then lose to the
    generated depthwise kernel: tests/test_cuda_codegen_depthwise.py.)"""
    monkeypatch.setenv("TORCHKILN_CACHE_DIR", str(tmp_path))
    from torchkiln.runtime.backends.cuda.timing import TimingCache

    model = _DilatedDepthwise(480).eval().cuda().half()
    x = torch.randn(16, 32, 28, 28, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    compiled = torchkiln.compile(model, [x], enabled_precisions={torch.float16})
    choices = [c for key, c in TimingCache.load().entries.items() if "depthwise_layout" in key]
    assert choices in (["nchw"], ["channels_last"])
    kernels = _engine(compiled).plans[0].kernels
    nchw = [k for k in kernels if k.op in ("convolution", "conv_epilogue") and k.option("channels_last") is False]
    assert len(nchw) == (choices == ["nchw"] and "depthwise" not in {k.op for k in kernels})
    with torch.no_grad():
        _close(compiled(x), model(x), fp16=True)


class _IntegerWork(torch.nn.Module):
    """RoBERTa's position ids (mask, cumsum, type_as, multiply, offset) with the embedding after them, and integer
    arithmetic around the limits: wrapping products, floor division and remainder by constants of negatives."""

    def __init__(self):
        super().__init__()
        self.positions = torch.nn.Embedding(600, 16, padding_idx=1)

    def forward(self, ids, big):
        mask = ids.ne(1).int()
        incremental = torch.cumsum(mask, dim=1).type_as(mask) * mask
        wrapped = (big * 3 + 7) // -5 + big.int() % 7
        return self.positions(incremental.long() + 1), wrapped


def test_integer_work_runs_in_generated_kernels_exactly_as_eager():
    """Compiled by Triton on the GPU (scans, integer casts and Python's floor division): exact, and one generated row
    step makes the position ids."""
    torch.manual_seed(0)
    module = _IntegerWork().eval().cuda()
    ids = torch.randint(2, 600, (32, 512), device="cuda")
    ids[:, 400:] = 1
    big = torch.randint(-2**62, 2**62, (32, 512), device="cuda")
    spec = [torchkiln.Input(ids.shape, dtype=torch.int64), torchkiln.Input(big.shape, dtype=torch.int64)]
    compiled = torchkiln.compile(module, spec, backend="cuda", min_block_size=1)
    plan = _engine(compiled).plans[0]
    assert ("generated", "rows") in {(k.kind, k.op) for k in plan.kernels}
    for got, want in zip(compiled(ids, big), module(ids, big)):
        assert got.dtype == want.dtype and torch.equal(got, want)
