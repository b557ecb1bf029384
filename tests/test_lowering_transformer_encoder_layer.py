"""nn.TransformerEncoderLayer's fused inference kernel (aten::_transformer_encoder_layer_fwd: a module traced without
gradients records it; a scripted one reaches it once the build-time facts of inference fold the layer's fast-path
checks) unpacked into the layer's ops (unpack_transformer_encoder_layer): one engine, against eager PyTorch, which
runs the fused kernel itself."""
import pytest
import torch
from harness import check_compiled

FUSED = "aten::_transformer_encoder_layer_fwd"


class Encoder(torch.nn.Module):
    """Two batch-first encoder layers and a head; the lambda keeps it from scripting, so it is traced."""

    def __init__(self, norm_first: bool, activation: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation, batch_first=True,
                                                 norm_first=norm_first, layer_norm_eps=1e-6)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        head = lambda t: self.head(t)  # noqa: E731
        return head(self.encoder(x, src_key_padding_mask=padding))


def _uses_the_fused_kernel(model: torch.nn.Module, *example: torch.Tensor) -> bool:
    """Whether eager PyTorch runs this model through the fused kernel (the condition the test stands on)."""
    with torch.no_grad():
        graph = torch.jit.trace(model, example, check_trace=False).inlined_graph
    return graph.findNode(FUSED) is not None


@pytest.mark.parametrize("norm_first", [False, True], ids=["norm-after", "norm-first"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_fused_encoder_layer_becomes_one_engine(norm_first, activation):
    model = Encoder(norm_first, activation).eval()
    x = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(1)) * 2
    assert _uses_the_fused_kernel(model, x)
    check_compiled(model, [x])  # one engine, no PyTorch block, within fp32 rounding of eager


class Scripted(torch.nn.Module):
    """The same encoder and head, scriptable."""

    def __init__(self, norm_first: bool) -> None:
        super().__init__()
        traced = Encoder(norm_first, "gelu")
        self.encoder, self.head = traced.encoder, traced.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


@pytest.mark.parametrize("norm_first", [False, True], ids=["norm-after", "norm-first"])
def test_a_scripted_encoder_layer_becomes_one_engine(norm_first):
    """Scripted, the fused call sits behind Ifs on grad mode, autocast and the inputs' devices, which fold after shape
    analysis (inference: no grad, no autocast, the engine's device); the call is unpacked then."""
    model = Scripted(norm_first).eval()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(3))
    assert torch.jit.script(model).inlined_graph.findNode(FUSED, True) is not None
    check_compiled(model, [x])


def test_an_encoder_layer_kept_in_pytorch_is_not_unpacked():
    """torch_executed_ops names the fused op: neither the pipeline nor its run after shape analysis rewrites it."""
    model = Scripted(False).eval()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(3))
    _, report = check_compiled(model, [x], engines=None, torch_blocks=None, torch_executed_ops=[FUSED])
    assert FUSED in {o for b in report.blocks if b.target != "engine" for o in b.ops}


def test_a_layer_given_a_mask_stays_in_pytorch():
    """The fused kernel's merged-mask convention is not unpacked: the layers stay in PyTorch, and match eager."""
    model = Encoder(False, "relu").eval()
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(2))
    padding = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    assert _uses_the_fused_kernel(model, x, padding)
    _, report = check_compiled(model, [x, padding], engines=None, torch_blocks=None)
    assert any(line.strip().startswith(FUSED) and "no converter" in line for line in str(report).splitlines())
