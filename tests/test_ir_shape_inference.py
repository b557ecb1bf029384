"""Shape inference (ir/shape_inference.py): kinds with a shape rule, inferred on CPU tensors with no elements, and
normalizations and attention, inferred by their rules, give what their meaning gives on meta tensors for every op,
dtype and broadcast (errors included), and compiles of a CNN and of a GroupNorm + attention block do not import
torch._dynamo (which meta tensors' Python references import, half a second)."""
import itertools
import os
import subprocess
import sys

import pytest
import torch

from torchkiln.errors import NetworkError
from torchkiln.ir import layers as L, pointwise as P
from torchkiln.ir.network import Network
from torchkiln.ir.reference import run_layer

DTYPES = (torch.float32, torch.float16, torch.int64, torch.bool)  # float, half, integer and bool promotions
SHAPES = (((2, 3), (2, 3)), ((), ()), ((2, 1, 3), (4, 1)), ((2, 3), (4,)))


def _on_meta(kind, params, shapes, dtypes, weights=None, device="meta"):
    """The meaning on meta tensors, as shape inference ran it for every kind before: (shape, dtype) or "error"."""
    layer = kind(name="l", inputs=[], **params)
    try:
        (out,) = run_layer(layer, [torch.zeros(s, dtype=d, device=device) for s, d in zip(shapes, dtypes)],
                           {k: w.to(device) for k, w in (weights or {}).items()}, torch.device(device))
    except Exception:
        return "error"
    return tuple(out.shape), out.dtype


def _expected(kind, params, shapes, dtypes, weights=None):
    """What meta tensors give, except where the CPU kernel itself gives another dtype (ldexp of 0-d tensors: meta
    promotes to float32, the kernel keeps float16): engines compute what the kernels do."""
    meta = _on_meta(kind, params, shapes, dtypes, weights)
    real = _on_meta(kind, params, shapes, dtypes, weights, device="cpu")
    return real if meta != "error" and real != "error" and real != meta else meta


def _inferred(kind, params, shapes, dtypes, weights=None):
    net = Network("n")
    inputs = [net.add_input(f"x{i}", d, s) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    try:
        (out,) = net.add_layer(kind, inputs, weights=weights, **params).outputs
    except NetworkError:
        return "error"
    return tuple(out.shape), out.dtype


def _cases():
    for op in P.ACTIVATION:
        yield L.ActivationLayer, {"type": op, "alpha": 0.1, "beta": 0.2}, 1
    for op in P.UNARY:
        yield L.UnaryLayer, {"op": op}, 1
    for op in P.ELEMENTWISE:
        yield L.ElementWiseLayer, {"op": op}, 2
    for op, axes, keep in itertools.product(L.ReduceOperation, [(-1,), (0, 1)], [False, True]):
        yield L.ReduceLayer, {"op": op, "axes": axes, "keep_dims": keep}, 1


@pytest.mark.parametrize("kind,params,arity", list(_cases()),
                         ids=lambda c: str(c.KIND if isinstance(c, type) else c) if not isinstance(c, int) else "")
def test_a_kind_with_a_shape_rule_infers_what_meta_tensors_give(kind, params, arity):
    for shapes, dtypes in itertools.product(SHAPES, itertools.product(DTYPES, repeat=arity)):
        shapes = shapes[:arity]
        assert _inferred(kind, params, shapes, dtypes) == _expected(kind, params, shapes, dtypes), (shapes, dtypes)


MATMUL_SHAPES = (((2, 3), (3, 4)), ((5, 2, 3), (3, 4)), ((2, 1, 2, 3), (5, 3, 4)), ((2, 3), (4, 3)), ((3,), (3, 4)),
                 ((2, 3), (3,)), ((1, 3), (3, 1)))


@pytest.mark.parametrize("op0,op1", list(itertools.product([L.MatrixOperation.NONE, L.MatrixOperation.TRANSPOSE],
                                                           repeat=2)), ids=lambda o: o.value)
@pytest.mark.parametrize("bias", [None, (4,), (1,), (2, 4), (3, 1, 1)], ids=str)
def test_a_matrix_multiply_infers_what_meta_tensors_give(op0, op1, bias):
    for shapes, dtype in itertools.product(MATMUL_SHAPES, (torch.float32, torch.float16, torch.int64, torch.bool)):
        weights = None if bias is None else {"bias": torch.zeros(bias, dtype=dtype)}
        params = {"op0": op0, "op1": op1}
        assert _inferred(L.MatrixMultiplyLayer, params, shapes, (dtype, dtype), weights) == \
            _on_meta(L.MatrixMultiplyLayer, params, shapes, (dtype, dtype), weights), (shapes, dtype)


NORM = L.NormalizationKind
NORM_CASES = [  # (kind, params, input shape, weight shape or None)
    (NORM.GROUP, {"num_groups": 4}, (2, 8, 3, 3), (8,)), (NORM.GROUP, {"num_groups": 2}, (2, 8), None),
    (NORM.GROUP, {"num_groups": 1}, (1, 6, 5), (6,)), (NORM.LAYER, {"normalized_shape": (8,)}, (2, 5, 8), (8,)),
    (NORM.LAYER, {"normalized_shape": (5, 8)}, (2, 5, 8), (5, 8)), (NORM.LAYER, {"normalized_shape": (8,)}, (8,), None),
    (NORM.LAYER, {"normalized_shape": (7,)}, (2, 5, 8), None), (NORM.LAYER, {"normalized_shape": (2, 5, 8)}, (5, 8), None),
    (NORM.INSTANCE, {}, (2, 8, 3, 3), (8,)), (NORM.INSTANCE, {}, (2, 8), None)]


@pytest.mark.parametrize("kind,params,shape,weight", NORM_CASES, ids=lambda c: str(getattr(c, "value", c)))
def test_a_normalization_infers_what_meta_tensors_give(kind, params, shape, weight):
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        weights = {} if weight is None else {"scale": torch.ones(weight), "bias": torch.zeros(weight)}
        args = (L.NormalizationLayer, {"kind": kind, "epsilon": 1e-5, **params}, (shape,), (dtype,), weights)
        assert _inferred(*args) == _expected(*args), dtype


ATTENTION_CASES = [  # (params, query, key, value, mask shape and dtype or None)
    ({}, (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 16), None), ({"causal": True}, (3, 5, 8), (3, 5, 8), (3, 5, 8), None),
    ({}, (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), ((5, 7), torch.bool)),
    ({}, (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), ((2, 1, 5, 7), "same")),
    ({}, (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), ((4, 5, 6), torch.bool)),
    ({"enable_gqa": True}, (2, 8, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), None),
    ({"enable_gqa": True}, (2, 8, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), None),
    ({}, (2, 8, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), None), ({}, (2, 4, 5, 8), (2, 4, 7, 6), (2, 4, 7, 8), None),
    ({}, (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 6, 8), None), ({}, (2, 4, 5, 8), (1, 4, 7, 8), (1, 4, 7, 8), None),
    ({"scale": 0.5}, (4, 5, 8), (4, 7, 8), (4, 7, 3), None)]


@pytest.mark.parametrize("params,q,k,v,mask", ATTENTION_CASES, ids=str)
def test_attention_infers_what_meta_tensors_give(params, q, k, v, mask):
    for dtype in (torch.float32, torch.float16, torch.int64):
        shapes, dtypes = [q, k, v], [dtype] * 3
        if mask is not None:
            shapes.append(mask[0])
            dtypes.append(dtype if mask[1] == "same" else mask[1])
        args = (L.AttentionLayer, params, shapes, dtypes)
        assert _inferred(*args) == _expected(*args), dtype
    args = (L.AttentionLayer, params, [q, k, v], [torch.float32, torch.float16, torch.float32])
    assert _inferred(*args) == _expected(*args) == "error"


@pytest.mark.parametrize("model,options", [("SmallResNet(width=8)", ""), ("DiffusionBlock(c=32, heads=2, groups=8)", ""),
                                           ("DiffusionBlock(c=32, heads=2, groups=8)",
                                            ", backend='reference', native_tape=True")])
def test_compiling_does_not_import_torch_dynamo(model, options):
    """Nor does recording a tape (a torch dispatch mode, whose calls torch wraps in dynamo's disable by default)."""
    shape = (1, 3, 32, 32) if model.startswith("Small") else (1, 32, 8, 8)
    code = ("import sys, torch, torchkiln\n"
            "from torchkiln.examples import SmallResNet\n"
            "from torchkiln.examples.blocks import DiffusionBlock\n"
            "from torchkiln.runtime.execute_op import engine_from_blob\n"
            f"m = torchkiln.compile({model}.eval(), [torchkiln.Input({shape})]{options})\n")
    if options:
        code += "assert engine_from_blob(m._torchkiln_engine_0).tapes\n"
    code += "print('torch._dynamo' in sys.modules)\n"
    env = dict(os.environ, TORCHKILN_PROGRESS="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False", out.stderr
