"""Tactic timing for the CUDA planner, and the timing cache that makes a rebuild fast.

Where a layer has several implementations, the build runs each on the device at the opt shape
(`BackendOptions.timing_iterations` runs each, after warm-up, replayed from one CUDA graph as the runner replays
it and timed with CUDA events) and the plan keeps the fastest. Launched one by one instead, small kernels are timed
at the host's launch rate: a patch convolution at batch 1 took 84-89 us either way, where the engine ran it in a
few. Each result is stored in a JSON file keyed by the layer's signature, the GPU and the library
versions, so the next build of the same layers on the same machine times nothing:
`$TORCHKILN_CACHE_DIR/timing.json` (default `~/.cache/torchkiln/timing.json`). A cache file that cannot be read
is ignored (and rewritten); one that cannot be written only costs the next build its timing again.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import tempfile
import threading
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from torchkiln.errors import cause_line
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import DimSymbol, evaluate
from torchkiln.runtime.backends.base import BackendOptions
from torchkiln.runtime.backends.cuda.cache import cache_dir
from torchkiln.runtime.backends.cuda.capture import timing_capture
from torchkiln.runtime.backends.cuda.codegen import attention, compiling_ahead
from torchkiln.runtime.backends.cuda.patches import patch_gemm

logger = logging.getLogger(__name__)

MAX_ENTRIES = 100_000


class TimingCache:
    """Tactic choices by signature, read once per build and written back if anything was added."""

    def __init__(self, path: pathlib.Path, entries: dict[str, str]) -> None:
        self.path = path
        self.entries = entries
        self.changed = False

    @classmethod
    def load(cls) -> TimingCache:
        path = cache_dir() / "timing.json"
        try:
            raw = json.loads(path.read_text())
            entries = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)} \
                if isinstance(raw, dict) and len(raw) <= MAX_ENTRIES else {}
        except (OSError, ValueError):
            entries = {}
        return cls(path, entries)

    def get(self, key: str) -> str | None:
        return self.entries.get(key)

    def put(self, key: str, choice: str) -> None:
        self.entries[key] = choice
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as f:
                json.dump(self.entries, f)
            os.replace(f.name, self.path)
            self.changed = False
        except OSError as e:
            logger.warning("could not write the timing cache %s (the next build times its tactics again): %s",
                           self.path, e)


def opt_shape(shape: Sequence[object]) -> tuple[int, ...]:
    """A shape at the opt values of its symbols."""
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        else:
            out.append(evaluate(d, {s: s.opt for s in d.free_symbols if isinstance(s, DimSymbol)}))
    return tuple(out)


def time_ms(fn: Callable[[], object], iterations: int) -> float:
    """Mean milliseconds of `fn` on the current stream, after warm-up, by CUDA events."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iterations


def time_graphed_ms(fn: Callable[[], object], iterations: int) -> float:
    """Mean milliseconds of `fn` replayed from one CUDA graph of `iterations` calls: how the runner runs it, so
    launch costs count as they will (a tactic of more, shorter kernels pays for each)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with timing_capture(graph):
        for _ in range(iterations):
            fn()
    return time_ms(graph.replay, 1) / iterations


# tactic name -> torch.nn.attention.SDPBackend member
ATTENTION_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "flash": "FLASH_ATTENTION",
                      "math": "MATH"}


# `sdpa_kernel` sets process-wide flags and restores those it found on leaving: threads entering and leaving it at
# once (engines called from several threads) left the process with one backend or none, for every later attention.
_SDPA_FLAGS = threading.RLock()


def sdpa(backend: str, causal: bool = False, scale: float | None = None, enable_gqa: bool = False
         ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """Scaled dot-product attention through one backend ("" = PyTorch's own choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    options = dict(is_causal=causal, scale=scale, enable_gqa=enable_gqa)

    def chosen_by_pytorch(q, k, v, mask):
        with _SDPA_FLAGS:  # (not while another step's `sdpa_kernel` has narrowed the flags)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)

    if not backend:
        return heads_in_four_dims(lambda q, k, v, mask: chosen_by_pytorch(*map(last_dim_contiguous, (q, k, v, mask))))
    member = getattr(SDPBackend, ATTENTION_BACKENDS[backend])
    # Set when the backend refuses a call's inputs (a layout the timed inputs did not have): PyTorch chooses then.
    declined: list[bool] = []

    def run(q, k, v, mask):
        q, k, v, mask = map(last_dim_contiguous, (q, k, v, mask))
        if not declined:
            try:
                with _SDPA_FLAGS, sdpa_kernel(member):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)
            except RuntimeError as e:  # refused on the host, before anything ran
                if "No available kernel" not in str(e):
                    raise
                declined.append(True)
                logger.info("attention: the %s backend chosen at build time refuses these inputs (%s); PyTorch's "
                            "own choice runs them", backend, _shapes_and_strides(q, k, v, mask))
        return chosen_by_pytorch(q, k, v, mask)

    return heads_in_four_dims(run)


Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def heads_in_four_dims(attend: Attention) -> Attention:
    """`attend` over [N, heads, L, d] tensors: inputs with more leading dims (windows x batch: Twins' [B, windows,
    heads, L, d]) are given to it with those dims merged, a view where their strides allow, and its output is
    viewed back. SDPA's fused kernels take 4-D inputs only; PyTorch runs others through its math backend, which
    copies every operand and materializes the scores. A mask of more than 2 dims keeps the inputs as they are."""
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if q.dim() <= 4 or k.shape[:-3] != q.shape[:-3] or v.shape[:-3] != q.shape[:-3] \
                or (mask is not None and mask.dim() > 2):
            return attend(q, k, v, mask)
        lead = q.shape[:-3]
        out = attend(q.flatten(0, -4), k.flatten(0, -4), v.flatten(0, -4), mask)
        return out.view(*lead, *out.shape[1:])

    return run


def last_dim_contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` (an attention's query, key, value or mask) with its last dim contiguous, copied only where it is not:
    SDPA's fused kernels refuse an operand strided along its last dim, and then only the math backend runs, copying
    every operand and materializing the scores in fp32. A position bias gathered as [L, S, heads] and permuted (T5's)
    took 1.65 ms against 0.10 for cuDNN's kernel at [32,8,512,64] fp16 on an H100; a value viewed channels-first
    out of its projection (cross-covariance attention's [B, heads, d, tokens]) took 46 us a step on an H200, and
    XCiT-nano's call fell from 1.63 to 1.25 ms when it was copied."""
    if t is None or t.shape[-1] == 1 or t.stride(-1) == 1:
        return t
    return t.contiguous()


MASK_ALIGN = 8  # elements: SDPA's memory-efficient backend pads a mask whose strides (but the last) are not multiples


def constant_mask(layer: L.AttentionLayer) -> bool:
    """Whether `layer`'s mask is an additive (floating) constant: `aligned_mask` makes it once, not per call."""
    return len(layer.inputs) > 3 and isinstance(layer.inputs[3].producer, L.ConstantLayer) and \
        layer.inputs[3].dtype.is_floating_point


def aligned_mask(mask: torch.Tensor) -> torch.Tensor:
    """`mask`'s values in memory SDPA takes as it is: rows contiguous and every other stride a multiple of `MASK_ALIGN`
    (dims it broadcasts along keep stride 0, unmade). For a constant mask, made once: on every call SDPA's
    memory-efficient backend pads an unaligned mask itself, a fill and a copy (a window attention's [64,3,49,49]
    position bias: two of its three kernels, H100)."""
    if mask.stride(-1) == 1 and all(st % MASK_ALIGN == 0 for st in mask.stride()[:-1]):
        return mask
    keys = mask.shape[-1]
    made = [n if st or d == mask.dim() - 1 else 1 for d, (n, st) in enumerate(zip(mask.shape, mask.stride()))]
    padded = torch.zeros((*made[:-1], -(-keys // MASK_ALIGN) * MASK_ALIGN), dtype=mask.dtype, device=mask.device)
    padded[..., :keys].copy_(mask[tuple(slice(None) if n > 1 else slice(0, 1) for n in made)])
    return padded[..., :keys].expand(mask.shape)


def _shapes_and_strides(*tensors: torch.Tensor | None) -> str:
    return "; ".join(f"{list(t.shape)} strides {list(t.stride())}" for t in tensors if t is not None)


def first_calls(calls: Sequence[Callable[[], object]]) -> list[str | None]:
    """Run each call once, its generated kernels compiled first, side by side (`codegen.compiling_ahead`: a pass of
    the calls that launches nothing); why each failed, or None. (The chained variant that a generated step after
    another launches is compiled only for the chosen candidate, by the runner's dry run: `_Bound.compile_ahead`.)"""
    with torch.no_grad():
        with compiling_ahead():
            for run in calls:
                try:
                    run()
                except Exception:  # noqa: BLE001 - raised again by its first call below, which reports it
                    pass
        return [_first_call(run) for run in calls]


def _first_call(run: Callable[[], object]) -> str | None:
    try:
        run()
        return None
    except Exception as e:  # noqa: BLE001 - reported per candidate, which is then not timed
        return cause_line(e)


def _timed_choice(cache: TimingCache, key: str, candidates: Callable[[], dict[str, Callable[[], object]]],
                  timer: Callable[[Callable[[], object], int], float], iterations: int, what: str) -> str:
    """The cached choice for `key`; else the fastest of `candidates()` (made only then), timed by `timer` and
    cached. The candidates' generated kernels compile side by side first (`first_calls`). A candidate that fails
    (the library refuses the inputs, a generated kernel does not compile) is skipped; "" where every one is."""
    found = cache.get(key)
    if found is not None:
        return found
    times = {}
    made = candidates()
    errors = dict(zip(made, first_calls(list(made.values()))))
    with torch.no_grad():
        for name, run in made.items():
            error = errors.get(name)
            if error is None:
                try:
                    times[name] = timer(run, iterations)
                    continue
                except Exception as e:  # noqa: BLE001 - refused in its warm-up (no library kernel for these inputs)
                    error = cause_line(e)
            logger.debug("%s: %s refused: %s", what, name, error)  # skipped, the others timed
    choice = min(times, key=times.get) if times else ""
    logger.debug("tactic for %s: %s -> %s", what, {k: round(t, 4) for k, t in times.items()}, choice or "none")
    cache.put(key, choice)
    return choice


def attention_backend(layer: L.AttentionLayer, shapes: list[tuple[int, ...]], device: torch.device,
                      options: BackendOptions, cache: TimingCache) -> str:
    """The fastest SDPA backend for `layer` with inputs of `shapes` (its opt shapes), a generated kernel's tile (a
    key of `codegen.attention.CONFIGS`), or "" (PyTorch's own choice) without timing. Backends that refuse the inputs
    (flash with a mask, say) are skipped."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return ""
    dtypes = [t.dtype for t in layer.inputs]
    generated = attention.supported(layer, shapes) is None
    key = json.dumps([torch.cuda.get_device_name(device), torch.__version__, "attention", layer.causal,
                      layer.scale, layer.enable_gqa, [str(d) for d in dtypes], [list(s) for s in shapes],
                      constant_mask(layer), generated])

    def candidates() -> dict[str, Callable[[], object]]:
        q, k, v = (torch.randn(s, device=device, dtype=d) for s, d in zip(shapes[:3], dtypes[:3]))
        mask = None
        if len(shapes) > 3:  # everything visible: random masks can hide whole rows
            mask = torch.ones(shapes[3], device=device, dtype=dtypes[3]) if dtypes[3] == torch.bool else \
                torch.zeros(shapes[3], device=device, dtype=dtypes[3])
            mask = aligned_mask(mask) if constant_mask(layer) else mask  # as the step will pass it
        runs = {name: sdpa(name, layer.causal, layer.scale, layer.enable_gqa) for name in ATTENTION_BACKENDS}
        if generated:
            runs.update({name: attention.Attention(layer, name) for name in attention.CONFIGS})
        return {name: (lambda run=run: run(q, k, v, mask)) for name, run in runs.items()}

    return _timed_choice(cache, key, candidates, time_graphed_ms, options.timing_iterations,
                         f"{layer.name} (attention at {shapes})")


def fused_is_faster(conv: L.ConvolutionLayer, op: str, input_shape: tuple[int, ...], device: torch.device,
                    options: BackendOptions, cache: TimingCache) -> bool:
    """Whether cuDNN's fused `op` ("conv_relu" or "conv_add_relu") beats the convolution followed by its
    epilogue as a separate kernel, for this convolution at `input_shape`; True without timing. The separate
    epilogue is what the planner makes otherwise (`conv_epilogue`: the convolution without its bias, then one
    generated pass adding the bias [and the residual] and applying the ReLU); it is timed as the convolution
    without bias and one ATen pass of the same memory traffic."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return True
    w = conv.weights["kernel"]
    dtype = conv.outputs[0].dtype
    key = json.dumps([torch.cuda.get_device_name(device), torch.__version__, op, str(dtype), list(input_shape),
                      list(w.shape), list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups,
                      "bias" in conv.weights, "graphed"])

    def candidates() -> dict[str, Callable[[], object]]:
        cl = torch.channels_last
        x = torch.randn(input_shape, device=device, dtype=dtype).contiguous(memory_format=cl)
        weight = w.to(device=device, dtype=dtype).contiguous(memory_format=cl)
        bias = conv.weights.get("bias")
        bias = None if bias is None else bias.to(device=device, dtype=dtype)
        args = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)

        def plain():
            return torch.convolution(x, weight, None, *args[:3], False, [0, 0], args[3])

        if op == "conv_relu":
            return {"fused": lambda: torch.cudnn_convolution_relu(x, weight, bias, *args),
                    "unfused": lambda: torch.relu(plain())}
        z = torch.randn_like(plain())
        return {"fused": lambda: torch.cudnn_convolution_add_relu(x, weight, z, 1.0, bias, *args),
                "unfused": lambda: torch.add(plain(), z)}

    return _timed_choice(cache, key, candidates, time_graphed_ms, options.timing_iterations,
                         f"{conv.name} ({op} at {input_shape})") == "fused"


EPILOGUE_ACTIVATIONS = {L.ActivationType.RELU: False, L.ActivationType.GELU_TANH: True}  # type -> use_gelu


def linear_activation_is_faster(matmul: L.MatrixMultiplyLayer, activation: L.ActivationLayer,
                                input_shape: tuple[int, ...], device: torch.device, options: BackendOptions,
                                cache: TimingCache) -> bool:
    """Whether cuBLASLt's fused bias + activation epilogue (`torch._addmm_activation`: ReLU, or GELU's tanh form)
    beats the product followed by its activation as a separate pass, for this product at `input_shape`; True
    without timing. Timed in a CUDA graph, as the runner replays them."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return True
    w = matmul.inputs[1]
    dtype = matmul.outputs[0].dtype
    key = json.dumps([torch.cuda.get_device_name(device), torch.__version__, "linear_activation",
                      activation.type.value, str(dtype), list(input_shape), list(w.shape), matmul.op1.value,
                      "graphed"])

    def candidates() -> dict[str, Callable[[], object]]:
        x = torch.randn(input_shape, device=device, dtype=dtype).reshape(-1, input_shape[-1])
        weight = torch.randn(tuple(w.shape), device=device, dtype=dtype)
        weight = weight.t() if matmul.op1 == L.MatrixOperation.TRANSPOSE else weight
        bias = torch.randn(weight.shape[1], device=device, dtype=dtype)
        gelu = EPILOGUE_ACTIVATIONS[activation.type]
        after = (lambda y: F.gelu(y, approximate="tanh")) if gelu else torch.relu
        return {"fused": lambda: torch._addmm_activation(bias, x, weight, use_gelu=gelu),
                "unfused": lambda: after(torch.addmm(bias, x, weight))}

    return _timed_choice(cache, key, candidates, time_graphed_ms, options.timing_iterations,
                         f"{matmul.name} (with {activation.type.value} at {input_shape})") == "fused"


def patch_gemm_is_faster(conv: L.ConvolutionLayer, input_shape: tuple[int, ...], device: torch.device,
                         options: BackendOptions, cache: TimingCache, made_in_engine: bool = False) -> bool:
    """Whether the patch GEMM (patches.py) beats cuDNN for this patchifying convolution at `input_shape`; False
    without timing. cuDNN is timed as the plan would run it: channels-last (it was timed NCHW, chosen, and then ran
    channels-last in the engine at 69 us: an H200, [1,3,224,224], 16x16 windows to 384 channels). An engine input
    is converted to that layout in the call; an input `made_in_engine` is written channels-last by its step for a
    channels-last convolution (planner rule 7), so both candidates read it so and cuDNN pays no conversion (a
    downsampling 2x2 convolution of [32,96,56,56] ran as a copy into patches, 18 us, and a GEMM)."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return False
    w = conv.weights["kernel"]
    dtype = conv.outputs[0].dtype
    key = json.dumps([torch.cuda.get_device_name(device), torch.__version__, "patch_conv", str(dtype),
                      list(input_shape), list(w.shape), "bias" in conv.weights, "channels_last", "graphed",
                      "made in engine" if made_in_engine else "engine input"])

    def candidates() -> dict[str, Callable[[], object]]:
        x = torch.randn(input_shape, device=device, dtype=dtype)
        if made_in_engine:
            x = x.contiguous(memory_format=torch.channels_last)
        weight, bias = w.to(device=device, dtype=dtype), conv.weights.get("bias")
        bias = None if bias is None else bias.to(device=device, dtype=dtype)
        last = weight.contiguous(memory_format=torch.channels_last)
        return {"gemm": lambda: patch_gemm(x, weight, bias),
                "cudnn": lambda: F.conv2d(x.contiguous(memory_format=torch.channels_last), last, bias,
                                          list(w.shape[2:]))}

    return _timed_choice(cache, key, candidates, time_graphed_ms, options.timing_iterations,
                         f"{conv.name} (patch convolution at {input_shape})") == "gemm"


def depthwise_channels_last(conv: L.ConvolutionLayer, input_shape: tuple[int, ...], device: torch.device,
                            options: BackendOptions, cache: TimingCache) -> bool:
    """Whether a depthwise 2-D convolution runs faster channels-last (cuDNN's kernels) than NCHW (ATen's or
    cuDNN's NCHW kernels) with its input and output converted between the layouts; True without timing. cuDNN's
    channels-last depthwise kernels vary by an order of magnitude with the kernel size and dilation: a dilated 5x5
    at [32,960,28,28] fp16 on an H100 takes 2.48 ms channels-last and 0.41 NCHW, a 3x3 48 us and 78."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return True
    w = conv.weights["kernel"]
    dtype = conv.outputs[0].dtype
    args = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
    key = json.dumps([torch.cuda.get_device_name(device), torch.__version__, "depthwise_layout", str(dtype),
                      list(input_shape), list(w.shape), *args, "graphed"])

    def candidates() -> dict[str, Callable[[], object]]:
        cl = torch.channels_last
        x = torch.randn(input_shape, device=device, dtype=dtype).contiguous(memory_format=cl)
        weight = w.to(device=device, dtype=dtype)
        return {"channels_last": lambda: F.conv2d(x, weight.contiguous(memory_format=cl), None, *args),
                "nchw": lambda: F.conv2d(x.contiguous(), weight, None, *args).contiguous(memory_format=cl)}

    return _timed_choice(cache, key, candidates, time_graphed_ms, options.timing_iterations,
                         f"{conv.name} (depthwise layout at {input_shape})") == "channels_last"
