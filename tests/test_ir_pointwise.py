"""The pointwise op tables (ir/pointwise.py): a row for every op, each row's dtype rule agrees with its reference
meaning, and every ONNX slot names a form the exporter has (a Triton expression agreeing with the reference on
real and special values: test_cuda_codegen_pointwise.py)."""
import itertools

import pytest
import torch

from torchkiln.ir import layers as L, pointwise as P
from torchkiln.onnx_export.exporters import elementwise as onnx_elementwise

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)


@pytest.mark.parametrize("kind", list(P.FAMILIES), ids=lambda k: k.KIND)
def test_every_enum_member_has_a_row(kind):
    enum, table = P.FAMILIES[kind]
    assert set(table) == set(enum)


def _operands(dtypes):
    return [torch.tensor([1, 0, 1], dtype=d) if d == torch.bool else torch.tensor([0.5, 2.0, 3.0]).to(d)
            for d in dtypes]


@pytest.mark.parametrize("op", list(P.ELEMENTWISE) + list(P.UNARY), ids=lambda o: f"{type(o).__name__}.{o.name}")
def test_dtype_rule_matches_the_reference(op):
    row = P.ELEMENTWISE.get(op) or P.UNARY[op]
    arity = 2 if op in P.ELEMENTWISE else 1
    checked = 0
    for dtypes in itertools.product(DTYPES, repeat=arity):
        try:
            out = row.reference(*_operands(dtypes))
        except (RuntimeError, TypeError):  # eager refuses these dtypes (bitwise ops of floats, ...)
            continue
        assert out.dtype == P.result_dtype(row.dtype, dtypes), dtypes
        checked += 1
    assert checked


@pytest.mark.parametrize("kind", list(P.FAMILIES), ids=lambda k: k.KIND)
def test_every_onnx_slot_is_a_node_a_known_recipe_or_a_reason(kind):
    recipes = {L.ElementWiseLayer: onnx_elementwise._BINARY_RECIPES, L.UnaryLayer: onnx_elementwise._UNARY_RECIPES,
               L.ActivationLayer: onnx_elementwise._ACTIVATION_RECIPES}[kind]
    for op, row in P.FAMILIES[kind][1].items():
        form = row.onnx
        assert sum(map(bool, (form.op_type, form.recipe, form.declined))) == 1, op
        assert not form.recipe or form.recipe in recipes, op


def test_activation_reference_reads_alpha_and_beta():
    x = torch.linspace(-3, 3, 13)
    assert torch.equal(P.ACTIVATION[L.ActivationType.HARD_TANH].reference(x, -1.5, 2.0), x.clamp(-1.5, 2.0))
