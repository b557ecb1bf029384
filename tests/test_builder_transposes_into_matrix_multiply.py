"""transposes_into_matrix_multiply: a matrix multiply reads an operand transposed in its last two dims as it lies,
its op flipped; compared with eager PyTorch (fp32: 1e-4 * max|ref|), on the reference backend and ONNX Runtime,
and the CUDA plan (made on the CPU) has no copy step left for the transpose."""
import pytest
import torch
from torch import nn

import torchkiln
from torchkiln.builder import BuildSettings
from torchkiln.builder.pipeline import PASSES
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.runtime.backends import BackendOptions
from torchkiln.runtime.backends.cuda import planner
from torchkiln.runtime.engine import Engine

NONE, TRANSPOSE = L.MatrixOperation.NONE, L.MatrixOperation.TRANSPOSE


class _Scores(nn.Module):
    """Products of transposed operands (as DeBERTa's content-to-position and position-to-content scores are), one
    transpose also returned."""

    def forward(self, q, k, p):
        kt = k.transpose(-1, -2)
        return torch.bmm(q, kt), torch.bmm(p.transpose(-1, -2), q), kt


def _network(model, inputs):
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input.from_tensor(t) for t in inputs],
                                              backend="reference", min_block_size=1)
    return Engine.deserialize(data).network


class _Scaled(nn.Module):
    """q @ (k^T / scale) and (2 * p^T) @ q: the scalar elementwise layer moves before the transpose."""

    def forward(self, q, k, p):
        return torch.bmm(q, k.transpose(-1, -2) / 8.0), torch.bmm(2.0 * p.transpose(-1, -2), q)


@pytest.mark.parametrize("model,transposes", [(_Scores, 1), (_Scaled, 0)], ids=["direct", "through-a-scalar"])
@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_transposed_operands_are_read_as_they_lie(model, transposes, backend):
    """Both products read their operands untransposed; only a transpose returned as well stays (the returned
    k^T)."""
    torch.manual_seed(0)
    model = model().eval()
    q, k, p = torch.randn(2, 5, 8), torch.randn(2, 6, 8), torch.randn(2, 5, 6)
    net = _network(model, [q, k, p])
    products = [x for x in net.layers if isinstance(x, L.MatrixMultiplyLayer)]
    assert [(m.op0, m.op1) for m in products] == [(NONE, TRANSPOSE), (TRANSPOSE, NONE)]
    assert len([x for x in net.layers if L.transposition(x) is not None]) == transposes
    compiled = torchkiln.compile(model, inputs=[q, k, p], backend=backend, min_block_size=1)
    with torch.no_grad():
        for got, ref in zip(compiled(q, k, p), model(q, k, p)):
            assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_a_transpose_of_other_dims_stays():
    n = Network()
    a, b = n.add_input("a", torch.float32, (2, 3, 4)), n.add_input("b", torch.float32, (4, 2, 5))
    moved = n.add_shuffle(b, first_transpose=(1, 0, 2)).get_output()  # [2, 4, 5]: the batch dim moved
    n.mark_output(n.add_matrix_multiply(a, NONE, moved, NONE).get_output())
    assert not PASSES["transposes_into_matrix_multiply"](n, BuildSettings())


def test_the_cuda_plan_has_no_copy_for_the_transpose():
    model = _Scores().eval()
    net = _network(model, [torch.randn(2, 12, 16), torch.randn(2, 6, 16), torch.randn(2, 12, 6)])  # > 8 terms
    plan = planner.make_plan(net, torch.device("cpu"), BackendOptions(timing_iterations=0))
    reads = {id(t): plan.kernels[s.kernel] for s in plan.steps for j in s.layers
             if isinstance(net.layers[j], L.MatrixMultiplyLayer) for t in net.layers[j].inputs}
    assert len(reads) == 3 and all(k.op == "matrix_multiply" for k in reads.values())
    copies = [s for s in plan.steps if plan.kernels[s.kernel].op == "shuffle"]
    assert len(copies) == 1  # the returned k^T only
