"""The CUDA backend's planner: a network -> its plan for one GPU.

Decisions, in order (each is a row of the kernel table; `kernels.py` makes the callables):
1. **Convolution epilogues** (half precision, or fp32 where TF32 is allowed): a 2-D convolution whose only
   reader is a ReLU becomes one cuDNN call (`conv_relu`); one whose only reader is an add of a tensor of the
   same shape, read only by a ReLU, becomes `conv_add_relu` (the residual block's tail). Where timing is on,
   the fused call is timed against the unfused one at the opt shape and kept only if faster.
   (cuDNN's fused calls read the process-wide TF32 flag, so fp32 convolutions without TF32 permission never
   use them.)
2. **Pointwise groups**: elementwise, unary, activation, cast, scale and select (where) layers over one iteration
   space join one generated kernel. A layer joins the open group of a producer when its output has the group's shape and
   everything else it reads is ready before the group's first layer (so the group runs as one step at that
   point without reordering anything around it). An earlier open group of the same shape that such a layer also
   reads runs inside its group, where no step between the two reads it and nothing it reads lives longer for it
   (GELU's 0.5 * x and its tanh branch: one pass over x); a refused merge logs why.
   A plain convolution whose only reader is such a layer (of its shape) leads that layer's group: it runs
   without its bias, and the bias (a per-channel scale layer made for the kernel) is the group's first
   operation (`conv_epilogue`). So is one whose only reader is a row step's layer (a group norm after it), or a
   transpose that only such a layer reads (a layer norm over the channels of a channels-last view): the bias is
   the row kernel's first operation (along the axis the channels moved to).
3. **Quantized matrix multiplies** (quant_kernels.py): a matrix multiply of a dequantized int8 (or, from sm_89,
   fp8) activation by a dequantized constant weight runs on the quantized values (`torch._int_mm` /
   `torch._scaled_mm`) with the dequantize epilogue (`library`/`quantized_matmul`).
   3b. **Generated quantized products** (where timing is on): such a multiply with the generated pointwise step
   that alone reads its product (the cast back to half precision, an activation, the next layer's int8 quantize,
   a residual) is timed as one generated Triton GEMM on the quantized values (codegen/gemm.py: the dequantize,
   bias and pointwise layers in its epilogue) against those library steps; the faster is kept
   (`generated`/`quantized_gemm`). A per-tensor int8 quantize is a pointwise layer (rule 2), so it joins the
   kernel that makes its input.
   3c. **Quantized convolutions**: a 2-D convolution of a quantized kernel (one group) whose input is a per-tensor
   dequantized value it alone reads is one step with that dequantize (`library`/`dequantized_conv`: the dequantize,
   then cuDNN's float convolution, channels-last); where timing is on, it and the generated pointwise step that
   alone reads its output are timed as one generated implicit GEMM on the quantized values with those layers as its
   epilogue (codegen/quantized_conv.py: `generated`/`quantized_conv`), and the faster is kept. A dequantize whose
   value one later pointwise group alone reads (a residual block's input, read by the next convolution and by the
   add) runs in that group, not in its producer's, so steps write int8 or fp8 values between quantized layers, not
   float ones (`_dequantize_where_read`). The quantize and dequantize of a convolution's output join the add after
   it, which becomes that convolution's epilogue.
   3d. **Quantized max pools**: a max pool between a per-tensor dequantize and a quantize of the same parameters
   pools the quantized values (the generated max pool kernel on int8 or fp8: `_quantized_max_pools`).
   **Linear groups**: matrix multiplies of one input by constant weights (query, key and value projections)
   become one GEMM over their weights concatenated at load (`linear_group`); each output is a column view.
4. **Row groups** (fusion.py): each reduction over any axes (reduce, softmax, layer, instance and group norm) or
   scan along one axis (cumsum, cumprod) with the pointwise layers making its input and using its result, and the
   other reductions over the same rows, as one generated Triton kernel (`generated`/`rows`, codegen/reduction.py):
   a residual add, the precision pass's casts and a layer norm; scale, mask and softmax; RMSNorm written as a mean
   between pointwise layers; integer position ids made from a padding mask (mask, cumsum, multiply, offset); a
   squared L2 norm over the spatial (middle) dims of [N, H, W, C] activations.
   Without Triton, the half-precision layer norms between their casts become CUDA's layer norm on the half input
   (`library`/`layer_norm`); the rest run on ATen.
   4b. **Recomputed prologues**: a pointwise value a row step computes for its reduction and later generated
   pointwise steps over the value's shape also read is computed again by each of them from what it is made of,
   where that reads no more than the value (squeeze-excitation's activation: read by its mean and by the gate's
   multiply). The row step then writes only its row values: one write and one read of the activations saved,
   and a mean of long rows alone is reduced in spans.
5. **Library calls** for the rest of the heavy layers (convolution in channels-last, matrix multiply,
   attention through SDPA), and the layers' ATen meanings for everything else (CUDA variants in kernels.py).
   Attention's SDPA backend (cuDNN, memory-efficient, flash, math) is a tactic: each that accepts the inputs is
   timed in a CUDA graph at the opt shapes and the fastest is kept (PyTorch's own choice without timing).

5b. **Product epilogues** (half precision): a matrix multiply of a constant weight whose only reader is a ReLU or a
   tanh GELU (through reshapes that only regroup its rows) is one cuBLASLt call with that activation and the bias in
   its epilogue (`library`/`linear_activation`, `torch._addmm_activation`), where timing says it beats the product
   and a separate pass (a feed-forward layer's up-projection).

6. **Generated products** (where timing is on): a 1x1 convolution of stride 1 with its generated epilogue (an
   inverted residual's expand and project convolutions: bias, ReLU6, residual), in half precision, is timed as one
   generated Triton GEMM with the epilogue fused (codegen/gemm.py, a tile configuration by the product's size)
   against the library convolution followed by the pointwise kernel; a depthwise 2-D convolution step (cuDNN's, in
   the layout rule 7 chose, alone, with its generated epilogue or in cuDNN's fused ReLU) is timed as one generated
   depthwise kernel with the same layers fused (codegen/depthwise.py, a few tile configurations by the output's
   size) against that step (`gemm_tactic.py`); the faster is kept (`generated`/`gemm` or `generated`/`depthwise`,
   the tile configuration its tactic). Linear layers stay on cuBLAS: a 768x3072 feed-forward GEMM with its GELU
   fused timed faster alone, but ran slower inside the engine (62 against 51 us per layer at batch 32 on an H100).

A convolution whose windows tile its input (stride == kernel, no padding: a patch embedding) is timed in half
precision as one GEMM over the patches (`patches.py`, `library`/`patch_conv`) against cuDNN.

7. **Layouts**: a channels-last convolution takes its input in that layout (converted where it is not: a depthwise
   weight is contiguous in both formats, so ATen chose its layout from the input), and a generated pointwise or
   row step whose 4-D outputs are read only as such inputs writes them channels-last (no conversion then). A
   depthwise convolution is the exception where timing says so: it runs NCHW (input converted there) when that,
   with both conversions, beats cuDNN's channels-last kernel (dilated 5x5: 0.41 against 2.48 ms at [32,960,28,28]);
   a generated depthwise step (rule 6) reads its input channels-last. A value of the convolution's output shape
   that the step's epilogue reads (a residual added to it: a positional convolution over tokens viewed as an image,
   `x + conv(x)`) counts as read channels-last too: the epilogue walks the convolution's channels-last output, and
   an NCHW one took the pointwise kernel's strided path, after ATen converted the same value for the convolution.
   An attention operand (query, key, value or mask) strided along its last dim is made row-major before SDPA,
   whose fused kernels refuse it.

8. **Movement as index arithmetic**: a movement layer that copies (a concatenation, a constant padding, a nearest
   resize by a whole ratio or a linear one, a reshape that merges dims of a transposed tensor (one that only splits
   them is a view: tokens transposed into a channels-last image), a repeat: a reshape that merges an expanded dim
   with another, a view that the library calls reading it would copy: a channel slice read by a convolution, heads
   whose batch dims do not merge read by a batched matrix multiply), or a permute between two generated
   pointwise steps (a layer scale over a channels-last view, permuted back and added to the residual), runs in a
   generated indexed kernel with the movable steps it alone feeds, down to the last one, and those that alone feed
   it, up to `MAX_SPAN` steps back (a movable step: a generated pointwise or indexed step, or a movement or
   pointwise layer of static shapes on ATen). RoPE's rotate-half with its multiplies is one kernel; so is a shifted
   window's roll with its window partition (two concatenations and a copy before). A gather counts where its
   indices are constant or proved in range (`ir/value_ranges.py`). A pool on ATen (average pools; max pools the
   generated max pool kernel refuses) counts too, with at most `MAX_TAPS` window positions: it joins the steps it
   alone feeds (a pool minus its input, a layer scale, a residual), but what makes its input runs before
   it (inside, that would be computed once per window position). A group refused (more than `MAX_LAYERS` layers,
   outputs of several shapes) logs why.

8b. **Small products**: a matrix multiply whose outputs each sum at most `SMALL_PRODUCT_K` products (a linear
   across a few attention heads: CaiT's talking heads, over permuted [N, L, L, H] scores) is a generated indexed
   step: unrolled products read through the operands' strides, where cuBLAS would take a copy of a permuted input
   and run a memory-bound GEMM. Rule 8 joins the movement around it (the permutes before and after) and the
   pointwise steps it alone feeds.

A 2-D max pool of a batched input runs in a generated Triton kernel over any strides, vectorized along the
channels of channels-last tensors (`max_pool`); its output keeps its input's memory format.

Every pair of steps these rules leave apart has a reason: `fusion_report.py` asks the rules above about the finished
plan (`_join_refusal`, `_merge_refusal`, `_Movement`, fusion.py's row join), and the cuda backend logs its lines at
debug level after planning.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor
from torchkiln.ir.quantization import same_grid
from torchkiln.ir.reference import run_layer
from torchkiln.runtime.backends.base import BackendOptions, BackendUnavailable
from torchkiln.runtime.backends.cuda import fusion, gemm_tactic, timing
from torchkiln.runtime.backends.cuda.codegen import attention, have_triton
from torchkiln.runtime.backends.cuda.kernels import CHANNELS_LAST_OUT, takes_channels_last
from torchkiln.runtime.backends.cuda.patches import patch_convolution
from torchkiln.runtime.backends.cuda.quant_kernels import CONV_KERNEL as QUANTIZED_CONV
from torchkiln.runtime.backends.cuda.quant_kernels import GENERATED_CONV_OP, quantized_convolutions, quantized_matmuls
from torchkiln.runtime.backends.cuda.quant_kernels import GENERATED_OP as GENERATED_QUANTIZED
from torchkiln.runtime.backends.cuda.quant_kernels import KERNEL as QUANTIZED_MATMUL
from torchkiln.runtime.plan import Kernel, Plan, Step, Target, target_here

logger = logging.getLogger(__name__)

POINTWISE = (L.ElementWiseLayer, L.UnaryLayer, L.ActivationLayer, L.CastLayer, L.ScaleLayer, L.SelectLayer,
             L.QuantizeLayer, L.DequantizeLayer)
HALF = (torch.float16, torch.bfloat16)


def target(device: torch.device) -> Target:
    """Plans depend on the GPU (tactic timing), torch (its cuDNN and cuBLAS) and Triton (generated kernels)."""
    libraries = [("torch", torch.__version__), ("cudnn", str(torch.backends.cudnn.version()))]
    try:
        import triton

        libraries.append(("triton", triton.__version__))
    except ImportError:
        pass
    return target_here("cuda", device, libraries, gpu_specific=True)


class _Graph:
    """Readers of every tensor, and what the network returns."""

    def __init__(self, network: Network) -> None:
        self.readers: dict[int, list[L.Layer]] = {}
        for layer in network.layers:
            for t in layer.inputs:
                self.readers.setdefault(id(t), []).append(layer)
        self.returned = {id(t) for t in network.outputs}
        self.index = {id(layer): j for j, layer in enumerate(network.layers)}

    def sole_reader(self, t) -> L.Layer | None:
        found = self.readers.get(id(t), [])
        return found[0] if len(found) == 1 and id(t) not in self.returned else None


def _is_relu(layer: L.Layer | None) -> bool:
    return isinstance(layer, L.ActivationLayer) and layer.type == L.ActivationType.RELU


def _epilogue(conv: L.ConvolutionLayer, graph: _Graph) -> tuple[str, list[L.Layer]] | None:
    """The fusable epilogue after `conv`: ("conv_relu", [relu]) or ("conv_add_relu", [add, relu])."""
    if conv.transposed or conv.weights["kernel"].dim() != 4:
        return None
    out = conv.outputs[0]
    nxt = graph.sole_reader(out)
    if _is_relu(nxt):
        return "conv_relu", [nxt]
    if isinstance(nxt, L.ElementWiseLayer) and nxt.op == L.ElementWiseOperation.SUM and len(nxt.inputs) == 2:
        other = nxt.inputs[1] if nxt.inputs[0] is out else nxt.inputs[0]
        relu = graph.sole_reader(nxt.outputs[0])
        if other is not out and other.shape == out.shape and other.dtype == out.dtype and _is_relu(relu):
            return "conv_add_relu", [nxt, relu]
    return None


def _epilogue_activation(matmul: L.MatrixMultiplyLayer, graph: _Graph, assigned: set[int]) -> list[L.Layer]:
    """The layers after a half-precision product of a constant weight that run in its cuBLASLt epilogue (rule 5b): the
    reshapes that only regroup its rows, then a ReLU or a tanh GELU; [] where there is none."""
    weight = matmul.inputs[1]
    if matmul.outputs[0].dtype not in HALF or matmul.op0 != L.MatrixOperation.NONE or weight.rank != 2 or \
            matmul.op1 not in (L.MatrixOperation.NONE, L.MatrixOperation.TRANSPOSE) or matmul.inputs[0].rank < 2 or \
            not isinstance(weight.producer, L.ConstantLayer):
        return []
    chain, reader = [], graph.sole_reader(matmul.outputs[0])
    while isinstance(reader, L.ShuffleLayer) and reader.keeps_last_dim():
        chain.append(reader)
        reader = graph.sole_reader(reader.outputs[0])
    if not isinstance(reader, L.ActivationLayer) or reader.type not in timing.EPILOGUE_ACTIVATIONS or \
            reader.outputs[0].dtype != matmul.outputs[0].dtype:
        return []
    chain.append(reader)
    return [] if any(graph.index[id(x)] in assigned for x in chain) else chain


def _fusable_precision(conv: L.ConvolutionLayer, options: BackendOptions) -> bool:
    dtype = conv.outputs[0].dtype
    return dtype in HALF or (dtype == torch.float32 and options.allow_tf32)


def make_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    """The CUDA plan of `network` (see the module docstring)."""
    data = network.data_symbols()
    if data:  # a CUDA graph replays fixed sizes, and the arena is planned at bound ones
        raise BackendUnavailable(f"the cuda backend does not run layers whose output size depends on the data "
                                 f"({', '.join(f'{layer.KIND} layer {layer.name!r}' for layer in data.values())}); "
                                 f"the reference backend runs them on the GPU")
    graph = _Graph(network)
    groups: list[tuple[Kernel, list[int]]] = []
    assigned: set[int] = set()
    first_at: dict[int, int] = {}  # a group placed at its first layer (default: at its last)
    for kernel, members in _row_groups(network, graph):
        first_at[len(groups)] = members[0]
        groups.append((kernel, members))
        assigned.update(members)
    def capability() -> tuple[int, int]:  # asked only for fp8
        return torch.cuda.get_device_capability(device)

    for members in quantized_matmuls(network, graph.sole_reader, capability):
        groups.append((QUANTIZED_MATMUL, members))  # at its last member, the multiply
        assigned.update(j for j in members if not isinstance(network.layers[j], L.ConstantLayer))
    for members in quantized_convolutions(network, graph.sole_reader, capability):
        groups.append((QUANTIZED_CONV, members))  # at the convolution
        assigned.update(members)
    for members in _quantized_max_pools(network, graph):
        groups.append((Kernel("generated", "max_pool"), members))  # at the quantize
        assigned.update(members)
    for members in _shared_input_linears(network, graph):
        first_at[len(groups)] = min(j for j in members if not isinstance(network.layers[j], L.ConstantLayer))
        groups.append((Kernel("library", "linear_group"), members))
        assigned.update(j for j in members if not isinstance(network.layers[j], L.ConstantLayer))
    cache = timing.TimingCache.load()
    engine_inputs = {id(t) for t in network.inputs}
    for j, layer in enumerate(network.layers):
        if j in assigned:
            continue
        if isinstance(layer, L.ConvolutionLayer) and layer.outputs[0].dtype in HALF and patch_convolution(layer) \
                and timing.patch_gemm_is_faster(layer, timing.opt_shape(layer.inputs[0].shape), device, options,
                                                cache, id(layer.inputs[0]) not in engine_inputs):
            groups.append((Kernel("library", "patch_conv"), [j]))
        elif isinstance(layer, L.ConvolutionLayer):
            found = _epilogue(layer, graph) if _fusable_precision(layer, options) else None
            if found is not None and any(graph.index[id(x)] in assigned for x in found[1]):
                found = None  # the add's other operand is a convolution that took this epilogue first
            if found is not None and timing.fused_is_faster(layer, found[0], timing.opt_shape(layer.inputs[0].shape),
                                                             device, options, cache):
                members = [j] + [graph.index[id(x)] for x in found[1]]
                assigned.update(members)
                groups.append((Kernel("library", found[0], (("channels_last", True),)), members))
                continue
            layout = _channels_last(layer) and (not _depthwise(layer) or timing.depthwise_channels_last(
                layer, timing.opt_shape(layer.inputs[0].shape), device, options, cache))
            groups.append((Kernel("library", "convolution", (("channels_last", layout),)), [j]))
        elif isinstance(layer, L.MatrixMultiplyLayer) and _small_product(layer):
            groups.append((Kernel("generated", "indexed"), [j]))
        elif isinstance(layer, L.MatrixMultiplyLayer):
            after = _epilogue_activation(layer, graph, assigned)
            if after and timing.linear_activation_is_faster(layer, after[-1], timing.opt_shape(layer.inputs[0].shape),
                                                            device, options, cache):
                members = [j] + [graph.index[id(x)] for x in after]
                assigned.update(members)
                groups.append((Kernel("library", "linear_activation"), members))
                continue
            groups.append((Kernel("library", "matrix_multiply"), [j]))
        elif _generated_max_pool(layer):
            groups.append((Kernel("generated", "max_pool"), [j]))
        elif isinstance(layer, L.AttentionLayer):
            shapes = [timing.opt_shape(t.shape) for t in layer.inputs]
            backend = timing.attention_backend(layer, shapes, device, options, cache)
            if backend in attention.CONFIGS:
                groups.append((Kernel("generated", "attention", (("config", backend),)), [j]))
            else:
                groups.append((Kernel("library", "attention", (("backend", backend),) if backend else ()), [j]))
        else:
            groups.append((Kernel("aten", layer.KIND), [j]))
        assigned.add(j)
    # A fused epilogue runs where its last layer is: the residual it adds may be made after the convolution
    # (a downsample branch), and nothing else reads what the group makes inside itself.
    # A linear group runs at its first matrix multiply (what reads its outputs comes after that).
    # A layer norm group runs at its first layer: it reads only what its first layer (the add, or the cast) reads.
    # Constants come first: they cost nothing to hold (the engine's weights), and any group may read them.
    for k, (kernel, members) in enumerate(groups):
        if all(isinstance(network.layers[j], L.ConstantLayer) for j in members):
            first_at[k] = -1
    order = sorted(range(len(groups)), key=lambda k: first_at.get(k, max(groups[k][1])))
    groups = [groups[k] for k in order]
    groups = _generated_biases(network, _fused_movement(network, _group_pointwise(network, groups, graph), graph))

    def choose(requests: list[gemm_tactic.Request]) -> list[str | None]:
        return gemm_tactic.choose(network, requests, graph.readers, graph.returned, device, options, cache)

    groups = _generated_products(network, groups, graph, choose)
    groups = _biases_into_row_steps(network, _recomputed_prologues(network, groups, graph), graph)
    cache.save()
    return _as_plan(target(device), _channels_last_outputs(network, groups))


ProductChooser = Callable[[list[gemm_tactic.Request]], list["str | None"]]
# library steps a generated depthwise convolution (with the same layers as its epilogue) may replace
DEPTHWISE_LIBRARY_OPS = ("convolution", "conv_epilogue", "conv_relu", "conv_add_relu")


Replaced = dict[int, tuple[gemm_tactic.Request, tuple[int, ...]]]  # its last step -> a request, the steps it replaces


def _generated_products(network: Network, groups: list[tuple[Kernel, list[int]]], graph: _Graph,
                        choose: ProductChooser) -> list[tuple[Kernel, list[int]]]:
    """Rules 3b and 6 of the module docstring: each request of `_product_requests` and `_quantized_requests` becomes
    one generated step where `choose(requests)` names a tile configuration for it (the timed tactic; None keeps the
    library steps). The generated step runs where the last library step it replaces ran (after everything its
    layers read: what the earlier steps make, only the later ones read)."""
    if not have_triton():
        return groups
    found = {**_product_requests(network, groups), **_quantized_requests(network, groups, graph)}
    merged, dropped = {}, set()
    for (at, (request, steps)), config in zip(found.items(), choose([r for r, _ in found.values()]) if found else []):
        if config is not None:
            merged[at] = (Kernel("generated", request.kind, (("config", config),)), request.members)
            dropped.update(steps)
    return [merged.get(g, group) for g, group in enumerate(groups) if g in merged or g not in dropped]


def _product_requests(network: Network, groups: list[tuple[Kernel, list[int]]]) -> Replaced:
    """Rule 6: a 1x1 convolution step with its generated epilogue (`conv_epilogue`) as a generated GEMM, and a
    depthwise convolution step (cuDNN's, in either layout, with or without its epilogue) as a generated depthwise
    kernel."""
    from torchkiln.runtime.backends.cuda.codegen.depthwise import depthwise_layer
    from torchkiln.runtime.backends.cuda.codegen.gemm import gemm_layer

    found: Replaced = {}
    for g, (kernel, members) in enumerate(groups):
        lead = network.layers[members[0]]
        if kernel.op == "conv_epilogue" and gemm_layer(lead) is None:
            found[g] = gemm_tactic.Request(members[0], tuple(members[1:]), (groups[g],)), (g,)
        elif kernel.kind == "library" and kernel.op in DEPTHWISE_LIBRARY_OPS and depthwise_layer(lead) is None:
            found[g] = gemm_tactic.Request(members[0], tuple(members[1:]), (groups[g],), "depthwise"), (g,)
    return found


def _quantized_requests(network: Network, groups: list[tuple[Kernel, list[int]]], graph: _Graph) -> Replaced:
    """Rules 3b and 3c: a quantized matrix multiply or convolution step, with the generated pointwise step that alone
    reads its product (the cast back to half precision and what follows it) as its epilogue, as one generated
    quantized GEMM or convolution."""
    from torchkiln.runtime.backends.cuda.codegen.gemm import quantized_gemm_layer

    owner: dict[int, int] = {}  # layer index -> the group that computes it (constants aside: every reader has them)
    for g, (_, members) in enumerate(groups):
        for j in members:
            if not isinstance(network.layers[j], L.ConstantLayer):
                owner.setdefault(j, g)
    found: Replaced = {}
    for g, (kernel, members) in enumerate(groups):
        if kernel == QUANTIZED_CONV:
            kind = GENERATED_CONV_OP
        elif kernel == QUANTIZED_MATMUL and quantized_gemm_layer(network.layers[max(members)]) is None:
            kind = GENERATED_QUANTIZED
        else:
            continue
        product = network.layers[max(members)]
        steps, prologue = [g], [j for j in members if j != max(members)]
        reader = graph.sole_reader(product.outputs[0])
        p = owner.get(graph.index[id(reader)]) if reader is not None else None
        epilogue: tuple[int, ...] = ()
        if p is not None and p not in found and groups[p][0].kind == "generated" and groups[p][0].op == "pointwise" \
                and all(t.shape == product.outputs[0].shape
                        for t in gemm_tactic.group_io(network, groups[p][1], graph.readers, graph.returned)[1]):
            steps.append(p)
            epilogue = tuple(groups[p][1])
        found[steps[-1]] = (gemm_tactic.Request(max(members), epilogue, tuple(groups[k] for k in steps), kind,
                                                tuple(sorted(prologue))), tuple(steps))
    return found


def _recomputed_prologues(network: Network, groups: list[tuple[Kernel, list[int]]], graph: _Graph
                          ) -> list[tuple[Kernel, list[int]]]:
    """Rule 4b of the module docstring: taken where every reader of the value outside its row step is a later
    generated pointwise step over the value's shape, the value is not returned, it is made from pointwise layers
    only, and what recomputing it reads is no larger than the value; else the reason is logged."""
    step_of: dict[int, int] = {}
    for g, (_, members) in enumerate(groups):
        for j in members:
            step_of.setdefault(j, g)
    grown = [list(members) for _, members in groups]
    for r, (kernel, members) in enumerate(groups):
        if (kernel.kind, kernel.op) != ("generated", "rows"):
            continue
        inside = set(members)
        for j in members:
            value = network.layers[j].outputs[0]
            if fusion.classify(network.layers[j]) != fusion.OpClass.POINTWISE or id(value) in graph.returned:
                continue
            readers = {step_of[graph.index[id(x)]] for x in graph.readers.get(id(value), [])} - {r}
            if not readers:
                continue
            chain = _made_within(network, graph, j, inside)
            reason = _why_not_recomputed(network, groups, graph, r, value, chain, readers)
            if reason is not None:
                logger.debug("%r is written by its row step rather than recomputed: %s", value.name, reason)
                continue
            for g in readers:
                grown[g] = sorted(set(grown[g]) | set(chain))
            logger.debug("%r is computed again by %d later steps instead of read", value.name, len(readers))
    return [(kernel, members) for (kernel, _), members in zip(groups, grown)]


def _made_within(network: Network, graph: _Graph, j: int, inside: set[int]) -> list[int]:
    """Layer `j` and the layers of `inside` it is computed from."""
    chain, todo = {j}, [j]
    while todo:
        for t in network.layers[todo.pop()].inputs:
            k = graph.index.get(id(t.producer)) if t.producer is not None else None
            if k is not None and k in inside and k not in chain:
                chain.add(k)
                todo.append(k)
    return sorted(chain)


def _why_not_recomputed(network: Network, groups: list[tuple[Kernel, list[int]]], graph: _Graph, r: int, value,
                        chain: list[int], readers: set[int]) -> str | None:
    """None if `value`, made in row step `r` by the layers `chain`, may be computed again by the steps `readers`
    (rule 4b)."""
    for g in readers:
        kernel, members = groups[g]
        if (kernel.kind, kernel.op) != ("generated", "pointwise") or g < r:
            return f"step {g} ({kernel.kind} {kernel.op}) reads it"
        if tuple(network.layers[members[0]].outputs[0].shape) != tuple(value.shape):
            return f"step {g} computes over {list(network.layers[members[0]].outputs[0].shape)}"
    if any(fusion.classify(network.layers[k]) != fusion.OpClass.POINTWISE for k in chain):
        return "it is made from a reduction"
    made = {id(t) for k in chain for t in network.layers[k].outputs}
    read = {id(t): t for k in chain for t in network.layers[k].inputs
            if id(t) not in made and not isinstance(t.producer, L.ConstantLayer)}
    if sum(_numel(t) * t.dtype.itemsize for t in read.values()) > _numel(value) * value.dtype.itemsize:
        return "recomputing it reads more than it"
    for g in readers:
        members = set(groups[g][1]) | set(chain)
        outside = {id(t) for k in members for t in network.layers[k].inputs
                   if t.producer is None or graph.index.get(id(t.producer)) not in members}
        if len(outside) + sum(len(network.layers[k].weights) for k in members) > fusion.MAX_OPERANDS:
            return f"step {g} would read more than {fusion.MAX_OPERANDS} tensors"
    return None


def _numel(t) -> int:
    """Elements of `t` at its opt shape."""
    return math.prod(timing.opt_shape(t.shape))


def _channels_last_outputs(network: Network, groups: list[tuple[Kernel, list[int]]]
                           ) -> list[tuple[Kernel, list[int]]]:
    """Rule 7 of the module docstring: a generated pointwise, indexed or row step whose outputs are all 4-D and read by
    other steps only as the input of channels-last convolutions, or as a residual their epilogues add, writes them
    channels-last (each convolution would otherwise copy its input into that layout). A row kernel walks its rows in its
    input's layout; its sizes are compile-time constants (`reduction.constant_sizes`), so Triton sees both the loads'
    and the stores' contiguous axes and converts the tile between them: a group norm + SiLU of an NCHW [32,128,64,64]
    fp16 input written channels-last took 52 us on an H100, against 54 + 21 for NCHW and the copy. Not a row step of
    dynamic shape: with run-time sizes the stores scatter (a GroupNorm ResBlock at [8,128,64,64] took 0.31 ms that way
    against 0.27 with the copy)."""
    wants: dict[int, bool] = {}  # tensor id -> every read of it from another step is a channels-last convolution's
    for kernel, members in groups:
        made = {id(t) for j in members for t in network.layers[j].outputs}
        takes = takes_channels_last(kernel, network.layers[members[0]])
        conv = next((network.layers[j] for j in members if isinstance(network.layers[j], L.ConvolutionLayer)), None)
        for j in members:
            for k, t in enumerate(network.layers[j].inputs):
                if id(t) not in made:  # the convolution's input, or a residual its epilogue adds in its layout
                    read = (j == members[0] and k == 0) or (j != members[0] and conv is not None and t.rank == 4
                                                            and tuple(t.shape) == tuple(conv.outputs[0].shape))
                    wants[id(t)] = wants.get(id(t), True) and takes and read
    returned = {id(t) for t in network.outputs}
    out = []
    for kernel, members in groups:
        if kernel.kind == "generated" and kernel.op in ("pointwise", "indexed", "rows"):
            leaving = [t for j in members for t in network.layers[j].outputs if id(t) in wants or id(t) in returned]
            if kernel.op == "rows" and any(t.is_dynamic for t in leaving):  # run-time sizes: the stores scatter
                leaving = []
            if leaving and all(t.rank == 4 and wants.get(id(t)) and id(t) not in returned for t in leaving):
                kernel = Kernel(kernel.kind, kernel.op, (*kernel.tactic, (CHANNELS_LAST_OUT, True)))
        out.append((kernel, members))
    return out


def _generated_biases(network: Network, groups: list[tuple[Kernel, list[int]]]) -> list[tuple[Kernel, list[int]]]:
    """A 2-D convolution left on its own with a bias (a residual branch's downsample, read by a fused step) runs
    without it, and the bias is a generated kernel (`conv_epilogue` of no further layers): the library's separate
    bias add over channels-last activations is not vectorized (79 us for a 1x1 downsample convolution's
    [32,256,56,56] output on an H100, against about 30 for one read and one write)."""
    if not have_triton():
        return groups
    out = []
    for kernel, members in groups:
        layer = network.layers[members[0]]
        if kernel.kind == "library" and kernel.op == "convolution" and "bias" in layer.weights \
                and kernel.option("channels_last"):
            kernel = Kernel("library", "conv_epilogue", kernel.tactic)
        out.append((kernel, members))
    return out


def _biases_into_row_steps(network: Network, groups: list[tuple[Kernel, list[int]]], graph: _Graph
                           ) -> list[tuple[Kernel, list[int]]]:
    """A convolution whose bias would be a kernel of its own (`conv_epilogue` of no further layers; rule 6 took no
    generated product for it) and whose only reader is a layer of a generated row step (a group norm after it)
    joins that step: the bias is the row kernel's first operation, one pass over the convolution's output instead
    of two. So does one read only by a transpose (alone in its step) that such a layer alone reads (a layer norm
    over the channels of a channels-last view): the row kernel reads the transposed view, the bias along the axis
    the channels moved to. The step runs where the row step ran."""
    steps: list[tuple[Kernel, list[int]] | None] = list(groups)
    where: dict[int, int] = {}
    for k, (_, members) in enumerate(groups):
        for j in members:
            where.setdefault(j, k)
    for k, step in enumerate(steps):
        if step is None or step[0].op != "conv_epilogue" or len(step[1]) != 1:
            continue
        kernel, members = step
        reader = graph.sole_reader(network.layers[members[0]].outputs[0])
        view: list[int] = []  # a transpose between, alone in its step: the row kernel reads the transposed view
        if L.transposition(reader) is not None and steps[where[graph.index[id(reader)]]] == \
                (Kernel("aten", reader.KIND), [graph.index[id(reader)]]):
            view = [graph.index[id(reader)]]
            reader = graph.sole_reader(reader.outputs[0])
        r = where.get(graph.index[id(reader)]) if reader is not None else None
        if r is None or r < k or steps[r] is None or steps[r][0] != Kernel("generated", "rows"):
            continue
        steps[r] = (kernel, members + view + steps[r][1])
        steps[k] = None
        for j in view:
            steps[where[j]] = None
    return [step for step in steps if step is not None]


def _shared_input_linears(network: Network, graph: _Graph) -> list[list[int]]:
    """Matrix multiplies x @ W.T (+ b) of one input x and constant weights W of one dtype (attention's query, key
    and value projections): one GEMM of the weights concatenated at load, its outputs column views of it. Each
    group lists, per multiply, its weight's constant layer and the multiply."""
    by_input: dict[int, list[tuple[int, int]]] = {}
    for j, layer in enumerate(network.layers):
        if not (isinstance(layer, L.MatrixMultiplyLayer) and layer.op0 == L.MatrixOperation.NONE
                and layer.op1 == L.MatrixOperation.TRANSPOSE):
            continue
        w = layer.inputs[1]
        if not isinstance(w.producer, L.ConstantLayer) or w.rank != 2 or layer.inputs[0].rank < 2:
            continue
        by_input.setdefault(id(layer.inputs[0]), []).append((graph.index[id(w.producer)], j))
    groups = []
    for pairs in by_input.values():
        first = network.layers[pairs[0][1]]
        same = [(c, j) for c, j in pairs if network.layers[j].outputs[0].dtype == first.outputs[0].dtype
                and network.layers[j].inputs[1].shape[1] == first.inputs[1].shape[1]
                and ("bias" in network.layers[j].weights) == ("bias" in first.weights)]
        if len(same) >= 2:
            groups.append([k for pair in same for k in pair])
    return groups


def _row_groups(network: Network, graph: _Graph) -> list[tuple[Kernel, list[int]]]:
    """Reductions with their prologue and epilogue (rule 4 of the module docstring): generated kernels where Triton
    is importable, else CUDA's layer norm for the half-precision ones between their casts."""
    if not have_triton():
        return [(Kernel("library", "layer_norm"), members) for members in _half_layer_norms(network, graph)]
    return [(Kernel("generated", "rows"), members) for members in fusion.row_groups(network)]


def _half_layer_norms(network: Network, graph: _Graph) -> list[list[int]]:
    """cast(half -> fp32) -> layer norm -> cast(fp32 -> the same half type), each read only by the next: what the
    precision pass makes of a half-precision layer norm, whose statistics it keeps in fp32. CUDA's layer norm
    reads half inputs and accumulates in fp32 itself, so the three become one kernel (rounding once, at the end,
    as the cast after the fp32 layer norm does)."""
    found = []
    for j, layer in enumerate(network.layers):
        if not (isinstance(layer, L.NormalizationLayer) and layer.kind == L.NormalizationKind.LAYER):
            continue
        cast_in, cast_out = layer.inputs[0].producer, graph.sole_reader(layer.outputs[0])
        if not (isinstance(cast_in, L.CastLayer) and isinstance(cast_out, L.CastLayer)):
            continue
        half = cast_in.inputs[0].dtype
        if half in HALF and layer.inputs[0].dtype == torch.float32 and cast_out.to_type == half \
                and graph.sole_reader(cast_in.outputs[0]) is layer:
            found.append([graph.index[id(cast_in)], j, graph.index[id(cast_out)]])
    return found


def _quantized_max_pools(network: Network, graph: _Graph) -> list[list[int]]:
    """Rule 3d: the members (dequantize, max pool, quantize) of each generated max pool between a per-tensor
    dequantize and a per-tensor quantize of the same type, scale, zero point and the type's whole range
    (`ir.quantization.same_grid`), each the only reader of the value before it: the pool of the quantized values is
    the same, exactly (a dequantize and its rounding are monotonic, so the largest value of a window is the
    dequantized largest; the quantize gives back the value it was made from), and reads and writes a quarter of the
    bytes."""
    found = []
    for j, pool in enumerate(network.layers):
        dq = pool.inputs[0].producer if _generated_max_pool(pool) else None
        q = graph.sole_reader(pool.outputs[0]) if dq is not None else None
        if isinstance(q, L.QuantizeLayer) and same_grid(q, dq) and graph.sole_reader(dq.outputs[0]) is pool:
            found.append([graph.index[id(dq)], j, graph.index[id(q)]])
    return found


def _small_product(layer: L.MatrixMultiplyLayer) -> bool:
    """Rule 8b: a matrix multiply whose outputs each sum a few products, computed by the indexed generator."""
    if not have_triton():
        return False
    from torchkiln.runtime.backends.cuda.codegen.indexed import small_product_refusal

    return small_product_refusal(layer) is None


def _generated_max_pool(layer: L.Layer) -> bool:
    """A 2-D max pool the generated Triton kernel computes (codegen/pooling.py; ATen's channels-last max pool is
    several times slower than its bytes need)."""
    from torchkiln.runtime.backends.cuda.codegen.pooling import poolable

    return isinstance(layer, L.PoolingLayer) and poolable(layer) is None


def _channels_last(conv: L.ConvolutionLayer) -> bool:
    return conv.weights["kernel"].dim() == 4


def _depthwise(conv: L.ConvolutionLayer) -> bool:
    """A 2-D convolution with one input channel per group, more than one group."""
    w = conv.weights["kernel"]
    return w.dim() == 4 and conv.groups > 1 and w.shape[1] == 1 and not conv.transposed


def _group_pointwise(network: Network, groups: list[tuple[Kernel, list[int]]], graph: _Graph
                     ) -> list[tuple[Kernel, list[int]]]:
    """Merge single pointwise layers into generated pointwise groups (rule 2 of the module docstring)."""
    out: list[tuple[Kernel, list[int]] | None] = []  # None: a group merged into a later one
    group_of: dict[int, int] = {}  # tensor id -> index in `out` of the open pointwise group making it
    made = {id(t) for layer in network.layers for t in layer.outputs}
    placed: dict[int, int] = {}  # tensor id -> index in `out` of the step making it

    def place(kernel: Kernel, members: list[int]) -> None:
        out.append((kernel, members))
        placed.update((id(t), len(out) - 1) for j in members for t in network.layers[j].outputs)

    generated = _fusable()
    for kernel, members in groups:
        layer = network.layers[members[0]]
        if len(members) != 1 or not isinstance(layer, POINTWISE) or kernel.kind != "aten":
            place(kernel, members)
            continue
        j = members[0]
        reason = "Triton is not installed" if generated is None else generated(layer)
        if reason is not None:  # no Triton, or a layer it cannot compute
            logger.debug("%s %r runs on ATen: %s", layer.KIND, layer.name, reason)
            place(kernel, members)
            continue
        target_group = None
        for t in layer.inputs:
            g = group_of.get(id(t))
            if g is None:
                g = _open_convolution(t, out, network, graph, layer)
                if g is not None:  # the convolution's bias and this layer become its generated epilogue
                    out[g] = (Kernel("library", "conv_epilogue", out[g][0].tactic), out[g][1])
                    group_of[id(t)] = g
            if g is None:
                continue
            if not _join_refusal(layer, network.layers[out[g][1][0]], g, made, placed, group_of):
                target_group = g
                break
        if target_group is None:
            place(Kernel("generated", "pointwise"), [j])
            target_group = len(out) - 1
        else:
            out[target_group][1].append(j)
            placed.update((id(t), target_group) for t in layer.outputs)
        for t in layer.outputs:
            group_of[id(t)] = target_group
        for t in layer.inputs:  # an earlier open group this layer also reads joins its group
            earlier = group_of.get(id(t))
            if earlier is None or earlier >= target_group:
                continue
            refused = _merge_refusal(network, out, earlier, target_group)
            if refused:
                logger.debug("pointwise group of %r stays apart from the group of %r that reads it: %s",
                             network.layers[out[earlier][1][0]].name, layer.name, refused)
            else:
                moved = out[earlier][1]
                out[target_group] = (out[target_group][0], moved + out[target_group][1])
                out[earlier] = None
                for m in moved:
                    for x in network.layers[m].outputs:
                        group_of[id(x)] = placed[id(x)] = target_group
    return _dequantize_where_read(network, [step for step in out if step is not None], graph)


def _dequantize_where_read(network: Network, steps: list[tuple[Kernel, list[int]]], graph: _Graph
                           ) -> list[tuple[Kernel, list[int]]]:
    """A dequantize in a generated pointwise step whose value only a later such step reads (over the value's shape)
    moves into that step: the first step then writes the int8 or fp8 value (where anything else reads it), not the
    float one two to four times its size (a residual block's input, read by the next convolution and by the add; a
    convolution's output quantized and dequantized for the add after it, which can then be its epilogue)."""
    pointwise = Kernel("generated", "pointwise")
    step_of = {j: k for k, (_, members) in enumerate(steps) for j in members}
    for k, (kernel, members) in enumerate(steps):
        if kernel != pointwise:
            continue
        for j in list(members):
            dq = network.layers[j]
            readers = graph.readers.get(id(dq.outputs[0]), [])
            into = {step_of[graph.index[id(r)]] for r in readers}
            if not isinstance(dq, L.DequantizeLayer) or id(dq.outputs[0]) in graph.returned or len(into) != 1:
                continue
            g = into.pop()
            if g == k or steps[g][0] != pointwise or \
                    dq.outputs[0].shape != network.layers[steps[g][1][0]].outputs[0].shape:
                continue
            members.remove(j)
            steps[g] = (pointwise, sorted(steps[g][1] + [j]))
            step_of[j] = g
    return [(kernel, members) for kernel, members in steps if members]


def _join_refusal(layer: L.Layer, lead: L.Layer, g: int, made: set[int], placed: dict[int, int],
                  group_of: dict[int, int]) -> str:
    """Why pointwise `layer` cannot join the open group at step `g` led by `lead` (whose value it reads), or "": what
    it reads is made by a step before the group's, or by the group itself (`placed`, `group_of`: tensor id -> the step
    making it, the open group making it; `made`: the ids of the tensors layers make), and its output has the group's
    shape."""
    late = [x.name for x in layer.inputs
            if not (id(x) not in made or placed.get(id(x), g) < g or group_of.get(id(x)) == g)]
    if late:
        return f"it reads {late[0]!r}, made after the group's step"
    if layer.outputs[0].shape != lead.outputs[0].shape:
        return f"its output's shape {list(layer.outputs[0].shape)} is not the group's {list(lead.outputs[0].shape)}"
    return ""


def _fused_movement(network: Network, steps: list[tuple[Kernel, list[int]]], graph: _Graph
                    ) -> list[tuple[Kernel, list[int]]]:
    """Rule 8 of the module docstring: a movement layer that copies (concatenation, padding, a reshape after a
    transpose), or a permute between two generated pointwise steps, joins the steps it alone feeds and the steps
    that alone feed it, as one generated indexed kernel (codegen/indexed.py: the moves are index arithmetic)."""
    if _fusable() is None:
        return steps
    moves = _Movement(network, steps, graph)
    out = moves.out
    for k in range(len(out)):
        if out[k] is None or not moves.candidate(k):
            continue
        members, sink, layers, reason = moves.group(k)
        if reason:
            logger.debug("%s %r stays apart from the steps around it: %s", network.layers[out[k][1][0]].KIND,
                         network.layers[out[k][1][0]].name, reason)
            continue
        for m in members:
            out[m] = None
        out[sink] = (Kernel("generated", "indexed"), layers)
        moves.step_of.update((j, sink) for j in layers)
    return [step for step in out if step is not None]


class _Movement:
    """Rule 8 over `steps` (an entry set to None: merged into a later one): which steps may join an indexed kernel,
    and the group a movement step would grow."""

    def __init__(self, network: Network, steps: list[tuple[Kernel, list[int]]], graph: _Graph) -> None:
        self.network, self.graph = network, graph
        self.out: list[tuple[Kernel, list[int]] | None] = list(steps)
        self.step_of = {j: k for k, (_, members) in enumerate(steps) for j in members}

    def movable(self, k: int) -> bool:
        from torchkiln.runtime.backends.cuda.codegen.indexed import indexed_fusable

        kernel, members = self.out[k]
        if (kernel.kind, kernel.op) not in (("generated", "pointwise"), ("generated", "indexed")) and \
                not (kernel.kind == "aten" and len(members) == 1 and kernel.op != "constant"):
            return False
        return all(indexed_fusable(self.network.layers[j]) is None for j in members)

    def sole_reader(self, k: int) -> int | None:
        """The one step reading every output of step `k` that anything reads, if there is one and `k`'s outputs
        are not returned."""
        outputs = [t for j in self.out[k][1] for t in self.network.layers[j].outputs]
        if any(id(t) in self.graph.returned for t in outputs):
            return None
        readers = {self.step_of[self.graph.index[id(r)]] for t in outputs
                   for r in self.graph.readers.get(id(t), [])} - {k}
        return readers.pop() if len(readers) == 1 else None

    def made_by(self, k: int) -> int | None:
        t = self.network.layers[self.out[k][1][0]].inputs[0]
        return self.step_of.get(self.graph.index.get(id(t.producer), -1)) if t.producer is not None else None

    def pools(self, k: int) -> bool:
        """Whether step `k` is a pool: it reads each input value once per window position, so what makes its input
        does not join its kernel (it would be computed once per position) and the pool does not join the kernel
        making its input."""
        return any(isinstance(self.network.layers[j], L.PoolingLayer) for j in self.out[k][1])

    def generated_pointwise(self, k: int | None) -> bool:
        return k is not None and self.out[k] is not None and self.out[k][0] == Kernel("generated", "pointwise")

    def view_between(self, k: int) -> bool:
        """A shuffle that copies nothing (a permute) between a generated pointwise step it alone reads and one
        that alone reads it: one indexed kernel then saves the pass over the moved value."""
        kernel, members = self.out[k]
        p = self.made_by(k)
        return kernel == Kernel("aten", "shuffle") and self.generated_pointwise(p) and self.sole_reader(p) == k and \
            self.generated_pointwise(self.sole_reader(k))

    def computes(self, k: int) -> bool:
        """Whether step `k` is a small product (rule 8b), which the movement around it joins."""
        return self.out[k][0] == Kernel("generated", "indexed") and \
            any(isinstance(self.network.layers[j], L.MatrixMultiplyLayer) for j in self.out[k][1])

    def candidate(self, k: int) -> bool:
        """Whether step `k` seeds an indexed kernel: a movable step that copies, a permute between two steps, or a
        small product."""
        return self.movable(k) and (_copies(self.network, self.out[k], self.graph) or self.view_between(k)
                                    or self.computes(k))

    def group(self, k: int) -> tuple[set[int], int, list[int], str]:
        """The steps candidate step `k` would join (down to the last one it alone feeds, and those that alone feed
        them up to MAX_SPAN steps back), the last of them, their layers, and why they cannot be one kernel ("")."""
        from torchkiln.runtime.backends.cuda.codegen.indexed import MAX_LAYERS

        out, network, graph = self.out, self.network, self.graph
        members, sink = {k}, k
        while (c := self.sole_reader(sink)) is not None and out[c] is not None and self.movable(c) and c > sink \
                and not self.pools(c):
            members.add(c)
            sink = c
        grew = True
        while grew:
            grew = False
            for m in sorted(members):
                for t in {id(x): x for j in out[m][1] for x in network.layers[j].inputs}.values():
                    p = self.step_of.get(graph.index.get(id(t.producer), -1)) if t.producer is not None else None
                    if p is None or p in members or out[p] is None or sink - p > MAX_SPAN or not self.movable(p) \
                            or self.sole_reader(p) not in members or any(
                                isinstance(r, L.PoolingLayer) for r in graph.readers.get(id(t), [])):
                        continue
                    members.add(p)
                    grew = True
        layers = [j for m in sorted(members) for j in out[m][1]]
        reason = _indexed_refusal(network, layers, graph, MAX_LAYERS)
        if not reason and not _copies(network, out[k], graph) and not self.computes(k) and \
                (self.made_by(k) not in members or sink == k):
            reason = "the view copies nothing and the steps around it do not join it"
        return members, sink, layers, reason


MAX_SPAN = 12  # steps a producer may run later, inside the indexed kernel it alone feeds (bounds held memory)


def _copies(network: Network, step: tuple[Kernel, list[int]], graph: _Graph) -> bool:
    """Whether an ATen movement step copies its input: a concatenation, a padding, a resize, a gather, a pool (a
    window read; max pools the generated max pool kernel takes are not ATen steps), a view that the library calls
    reading it copy into packed memory (`_library_packs`), a shuffle that reshapes an
    expanded tensor where no view can (a repeat: a broadcast dim merged with another), or a shuffle that merges dims
    of the output of a transpose (splitting them is a view). Not where the transposed tensor is an attention layer's
    output: SDPA's fused backends return it laid out [N, L, H, E], so the usual transpose(1, 2) and reshape back to
    [N, L, H * E] is a view, and ATen's reshape copies only where a backend's layout needs it."""
    kernel, members = step
    if kernel.kind != "aten":
        return False
    layer = network.layers[members[0]]
    if isinstance(layer, (L.ConcatenationLayer, L.PaddingLayer, L.ResizeLayer, L.GatherLayer, L.PoolingLayer)):
        return True
    if _library_packs(layer, graph):
        return True
    if not isinstance(layer, L.ShuffleLayer) or layer.reshape_dims is None:
        return False
    if isinstance(layer.inputs[0].producer, L.ExpandLayer):
        return _repeats(layer)
    moved = layer.first_transpose is not None and list(layer.first_transpose) != sorted(layer.first_transpose)
    source = layer.inputs[0].producer
    while not moved and isinstance(source, L.ShuffleLayer) and graph.sole_reader(source.outputs[0]) is not None:
        moved = any(perm is not None and list(perm) != sorted(perm)
                    for perm in (source.first_transpose, source.second_transpose))
        source = source.inputs[0].producer
    return moved and not isinstance(source, L.AttentionLayer) and \
        tuple(layer.inputs[0].shape) != tuple(layer.outputs[0].shape) and not _splits_only(layer)


def _library_packs(layer: L.Layer, graph: _Graph) -> bool:
    """Whether every reader of view `layer`'s output is a library call that copies it into packed memory first
    (ATen's strided copy, several times slower than a generated one): a convolution reading a channel slice of a
    batched map (Res2Net's and MixNet's channel splits; cuDNN takes packed maps), or a batched matrix multiply reading
    a view whose batch dims do not merge into one stride (heads split from a [B, L, 3, H, D] projection and permuted:
    torch.matmul reshapes them to [B * H, L, D])."""
    out = layer.outputs[0]
    readers = graph.readers.get(id(out), [])
    if not readers or id(out) in graph.returned:
        return False
    for reader in readers:
        if isinstance(reader, L.ConvolutionLayer) and reader.inputs[0] is out:
            if not (isinstance(layer, L.SliceLayer) and out.rank == 4 and _channel_slice(layer)):
                return False
        elif not (isinstance(reader, L.MatrixMultiplyLayer) and _batch_copied(reader, out)):
            return False
    return True


def _channel_slice(layer: L.SliceLayer) -> bool:
    """Whether `layer` takes part of dim 1 of a batched tensor and all of its other dims: packed in neither layout."""
    x = layer.inputs[0]
    return isinstance(x.shape[0], int) and x.shape[0] > 1 and layer.shape[1] < x.shape[1] and all(
        n == x.shape[d] and layer.start[d] == 0 and layer.stride[d] == 1
        for d, n in enumerate(layer.shape) if d != 1)


def _batch_copied(matmul: L.MatrixMultiplyLayer, operand: Tensor) -> bool:
    """Whether torch.matmul copies `operand` (a view, both operands batched): the view chain's meanings, run on a
    meta tensor laid out as the layer that made the data lays it out, then matmul's reshape of the batch dims, do not
    all stay views of it, or neither matrix dim has stride 1. The layout is taken as row-major (a matrix multiply,
    or an output of another rank than 4, which no rule lays out channels-last); otherwise unknown, and False. A
    wrong guess costs a pass, never a value."""
    if any(t.rank < 3 for t in matmul.inputs) or L.MatrixOperation.VECTOR in (matmul.op0, matmul.op1):
        return False
    views, t = [], operand
    while isinstance(t.producer, (L.ShuffleLayer, L.SliceLayer)):
        views.append(t.producer)
        t = t.producer.inputs[0]
    root = t.producer
    if not views or root is None or isinstance(root, L.AttentionLayer) or \
            (t.rank == 4 and not isinstance(root, L.MatrixMultiplyLayer)) or \
            any(not isinstance(d, int) for v in views for d in (*v.inputs[0].shape, *v.outputs[0].shape)):
        return False
    base = x = torch.empty(t.shape, device="meta")
    for view in reversed(views):
        x = run_layer(view, [x], view.weights, base.device)[0]
    if (matmul.op0 if operand is matmul.inputs[0] else matmul.op1) == L.MatrixOperation.TRANSPOSE:
        x = x.transpose(-1, -2)
    x = x.reshape(-1, *x.shape[-2:])
    return not torch._C._is_alias_of(x, base) or 1 not in x.stride()[-2:]


def _splits_only(shuffle: L.ShuffleLayer) -> bool:
    """Whether `shuffle`'s reshape only splits dims of its (transposed) input, or adds or drops dims of size 1: a
    view whatever the input's strides (a transposed [N, H * W, C] split into [N, C, H, W] is channels-last)."""
    if shuffle.second_transpose is not None:
        return False
    shape = list(shuffle.inputs[0].shape)
    if shuffle.first_transpose is not None:
        shape = [shape[d] for d in shuffle.first_transpose]
    sizes = [[d for d in dims if d != 1] for dims in (shape, shuffle.outputs[0].shape)]
    if any(not isinstance(d, int) for dims in sizes for d in dims):
        return False
    parts = iter(sizes[1])
    for d in sizes[0]:
        product = 1
        while product < d:
            product *= next(parts, d + 1)  # past the last part: a product that cannot be d
        if product != d:
            return False
    return next(parts, None) is None


def _repeats(shuffle: L.ShuffleLayer) -> bool:
    """Whether `shuffle`, reading an expand layer's output, copies it: its first transpose or its reshape cannot be a
    view of the broadcast (stride 0) tensor (tried on the meta device, static shapes only, the expand's input taken
    as contiguous: where it is not, a copy may be missed, which costs time, never a wrong value)."""
    expand = shuffle.inputs[0].producer
    shapes = [expand.inputs[0].shape, expand.outputs[0].shape, shuffle.outputs[0].shape]
    if any(not isinstance(d, int) for shape in shapes for d in shape) or shuffle.second_transpose is not None:
        return False
    source, expanded, out = shapes
    view = torch.empty([1] * (len(expanded) - len(source)) + list(source), device="meta").expand(expanded)
    if shuffle.first_transpose is not None:
        view = view.permute(shuffle.first_transpose)
    try:
        view.view(out)
    except RuntimeError:
        return True
    return False


def _indexed_refusal(network: Network, layers: list[int], graph: _Graph, max_layers: int) -> str:
    """Why `layers` cannot be one indexed kernel, or "": at most `max_layers`, and what leaves it (read by other
    steps or returned) of one shape."""
    if len(layers) > max_layers:
        return f"the kernel would compute {len(layers)} layers (at most {max_layers})"
    inside = {id(network.layers[j]) for j in layers}
    leaving = [t for j in layers for t in network.layers[j].outputs
               if id(t) in graph.returned or any(id(r) not in inside for r in graph.readers.get(id(t), []))]
    shapes = {tuple(t.shape) for t in leaving}
    return f"its outputs have shapes {sorted(shapes)}, not one" if len(shapes) != 1 else ""


def _merge_refusal(network: Network, out: list[tuple[Kernel, list[int]] | None], earlier: int, later: int) -> str:
    """Why the generated pointwise group at `earlier` cannot run inside the one at `later` (a layer of `later` reads
    it), or "" if it can: both are pointwise groups over one shape, no step between them reads what `earlier` makes
    (its layers read only what was made before it, so they can run later), and what `earlier` reads from other
    steps `later` reads too, or no step runs between them (no value lives longer). Sibling passes over one input,
    such as GELU's 0.5 * x and its tanh branch, become one pass."""
    if any(out[g][0].kind != "generated" or out[g][0].op != "pointwise" for g in (earlier, later)):
        return "one of them is not a generated pointwise group"
    lead = [network.layers[out[g][1][0]].outputs[0].shape for g in (earlier, later)]
    if lead[0] != lead[1]:
        return f"their shapes differ ({list(lead[0])} and {list(lead[1])})"
    made = {id(t) for m in out[earlier][1] for t in network.layers[m].outputs}
    between = [network.layers[m].name for step in out[earlier + 1:later] if step is not None for m in step[1]
               if any(id(x) in made for x in network.layers[m].inputs)]
    if between:
        return f"{between[0]!r}, which runs between them, reads it"
    # bounded memory: what it reads from other steps the later group reads too, or no step runs between them, so
    # nothing is kept alive longer
    if all(step is None for step in out[earlier + 1:later]):
        return ""
    later_reads = {id(x) for m in out[later][1] for x in network.layers[m].inputs}
    kept = [x.name for m in out[earlier][1] for x in network.layers[m].inputs
            if id(x) not in made and id(x) not in later_reads and x.producer is not None
            and not isinstance(x.producer, L.ConstantLayer)]
    return f"it would keep {kept[0]!r} alive until the later group runs" if kept else ""



def _open_convolution(t, out: list[tuple[Kernel, list[int]] | None], network: Network, graph: _Graph,
                      reader: L.Layer) -> int | None:
    """The index in `out` of the plain convolution step making `t`, if `reader` is the only reader of `t` and
    keeps its shape: then the convolution runs without its bias, and the bias joins `reader`'s generated
    kernel (one kernel after the convolution instead of cuDNN's separate bias add and the pointwise one)."""
    if graph.sole_reader(t) is not reader or reader.outputs[0].shape != t.shape or \
            not isinstance(t.producer, L.ConvolutionLayer):
        return None
    j = graph.index[id(t.producer)]
    for g in range(len(out) - 1, -1, -1):
        if out[g] is not None and out[g][1] == [j] and out[g][0].op == "convolution":
            return g
    return None


def _fusable():
    """codegen's `fusable(layer) -> why not | None`, or None where Triton is not installed."""
    if not have_triton():
        logger.info("no generated kernels (Triton is not installed); pointwise layers run on ATen")
        return None
    from torchkiln.runtime.backends.cuda.codegen.pointwise import fusable

    return fusable


def _as_plan(target: Target, groups: list[tuple[Kernel, list[int]]]) -> Plan:
    kernels: list[Kernel] = []
    index: dict[Kernel, int] = {}
    steps = []
    for kernel, members in groups:
        if kernel not in index:
            index[kernel] = len(kernels)
            kernels.append(kernel)
        steps.append(Step(index[kernel], tuple(members)))
    return Plan(target, kernels, steps)
