"""Dynamic shapes end to end: one engine serves every shape in the Input ranges; checked against eager at
min, opt, max and shapes between; out-of-range inputs raise EngineInputError; saved modules reload."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from harness import assert_matches_eager, tiny_bert

import torchkiln
from torchkiln.compiler import compile_with_report


# torch 2.11's shape rules for scaled_dot_product_attention with a mask and for pooling over a dynamic spatial
# dim branch on the size, so there those layers need static shapes and run in PyTorch (still correct); from
# torch 2.13 (this project's CPU CI) they are symbolic and these models are one engine.
FULLY_SYMBOLIC = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"


def _assert_one_engine(report):
    if FULLY_SYMBOLIC:
        assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, str(report)
    else:
        assert report.num_engine_blocks >= 1, str(report)


def _assert_one_ort_session(compiled):
    """The compiled module's one engine runs on ONNX Runtime as one session (no reference segment, no fallback)."""
    from torchkiln.runtime.backends.onnxruntime import OrtRunner
    from torchkiln.runtime.execute_op import engine_from_blob
    from torchkiln.stitching.stitch import ENGINE_ATTR

    blobs = [getattr(m, ENGINE_ATTR.format(0)) for m in compiled.modules() if hasattr(m, ENGINE_ATTR.format(0))]
    assert len(blobs) == 1 and not any(hasattr(m, ENGINE_ATTR.format(1)) for m in compiled.modules()), blobs
    runner = engine_from_blob(blobs[0]).runner(torch.device("cpu"))
    assert isinstance(runner, OrtRunner) and runner.sessions == 1 and len(runner.steps) == 1, runner


def _compile(model, inputs, **settings):
    model = model.eval()
    return compile_with_report(model, inputs, **settings)


def _one_engine_matching_eager(model, specs, make_args, shapes):
    """Compile `model` for `specs`: one engine, matching eager at each shape (make_args(shape) gives the arguments)."""
    compiled, report = _compile(model, specs)
    _assert_one_engine(report)
    _check_at(model, compiled, make_args, shapes)


def _check_at(model, compiled, make_args, shapes):
    """Run eager and compiled at each shape (make_args(shape) gives the arguments) and compare."""
    for shape in shapes:
        args = make_args(shape)
        with torch.no_grad():
            ref = model(*args)
            out = compiled(*args)
        assert_matches_eager(out, ref, path=f"output at {shape}")


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d((2, 2))
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


BATCH = torchkiln.Input(min_shape=(1, 3, 16, 16), opt_shape=(4, 3, 16, 16), max_shape=(8, 3, 16, 16))


@pytest.fixture(scope="module")
def cnn_dynamic_batch():
    torch.manual_seed(0)
    model = CNN().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    compiled, report = _compile(model, [BATCH])
    return model, compiled, report


def test_cnn_dynamic_batch_is_one_engine_and_matches_eager(cnn_dynamic_batch):
    model, compiled, report = cnn_dynamic_batch
    _assert_one_engine(report)
    _check_at(model, compiled, lambda n: [torch.randn(n, 3, 16, 16)], [1, 4, 8, 2, 7])


def test_out_of_range_input_raises_naming_input_dim_value_and_range(cnn_dynamic_batch):
    _, compiled, _ = cnn_dynamic_batch
    with pytest.raises(torchkiln.EngineInputError, match=r"engine input 0 \('x'\): dim 0 is 9, outside the "
                                                         r"range \[1, 8\]"):
        compiled(torch.randn(9, 3, 16, 16))
    with pytest.raises(torchkiln.EngineInputError, match=r"engine input 0 \('x'\): dim 2 is 17"):
        compiled(torch.randn(2, 3, 17, 16))


def test_report_shows_symbolic_dims(cnn_dynamic_batch):
    _, _, report = cnn_dynamic_batch
    text = str(report)
    assert "f32[s0,3,16,16]" in text or "float32[s0,3,16,16]" in text, text
    assert "s0 in [1, 8]" in text, text


def test_saved_dynamic_module_runs_in_a_new_process(cnn_dynamic_batch, tmp_path):
    model, compiled, _ = cnn_dynamic_batch
    path = tmp_path / "cnn.ts"
    torch.jit.save(compiled, str(path))
    xs = {n: torch.randn(n, 3, 16, 16) for n in (3, 8)}
    with torch.no_grad():
        refs = {n: model(x) for n, x in xs.items()}
    torch.save({"xs": xs, "refs": refs}, tmp_path / "data.pt")
    script = textwrap.dedent(f"""
        import torch, torchkiln
        m = torch.jit.load({str(path)!r})
        data = torch.load({str(tmp_path / 'data.pt')!r})
        for n, x in data["xs"].items():
            out = m(x)
            err = (out - data["refs"][n]).abs().max().item()
            assert err <= 1e-4 * data["refs"][n].abs().max().item(), (n, err)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


class SpatialCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x)) + torch.nn.functional.avg_pool2d(x, 3, 2, 1)
        x = x[:, :, : x.size(2) - 1, 1:]
        return self.fc(self.pool(x).flatten(1))


def test_cnn_dynamic_spatial_size():
    torch.manual_seed(0)
    model = SpatialCNN().eval()
    spec = torchkiln.Input(min_shape=(2, 3, 8, 8), opt_shape=(2, 3, 16, 16), max_shape=(2, 3, 32, 32))
    _one_engine_matching_eager(model, [spec], lambda hw: [torch.randn(2, 3, *hw)],
                               [(8, 8), (16, 16), (32, 32), (10, 12), (31, 9)])


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(24, 16)
        self.fc2 = torch.nn.Linear(16, 6)

    def forward(self, x):
        b = x.size(0)
        h = torch.relu(self.fc1(x.view(b, -1)))
        h = self.fc2(h).reshape(-1, 2, 3)
        return torch.flatten(h, 1).reshape(b, 3, -1)


def test_mlp_with_view_flatten_and_reshape_minus_one():
    torch.manual_seed(0)
    model = MLP().eval()
    spec = torchkiln.Input(min_shape=(1, 4, 6), opt_shape=(3, 4, 6), max_shape=(16, 4, 6))
    _one_engine_matching_eager(model, [spec], lambda n: [torch.randn(n, 4, 6)], [1, 3, 16, 2, 11])


class TupleModel(torch.nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor):
        a, b = pair
        return torch.relu(a @ b.transpose(-1, -2)) + bias, a.sum(1) * 2


def test_dynamic_input_inside_a_tuple_and_a_static_input():
    model = TupleModel().eval()
    seq = dict(min_shape=(1, 5), opt_shape=(4, 5), max_shape=(8, 5))
    spec = [(torchkiln.Input(**seq), torchkiln.Input(min_shape=(1, 5), opt_shape=(3, 5), max_shape=(6, 5))),
            torchkiln.Input((1,))]
    compiled, report = _compile(model, spec)
    assert report.num_engine_blocks == 1, str(report)
    _check_at(model, compiled, lambda nm: [(torch.randn(nm[0], 5), torch.randn(nm[1], 5)), torch.randn(1)],
              [(1, 1), (4, 3), (8, 6), (2, 5), (7, 2)])


class SizeArithmetic(torch.nn.Module):
    """Values computed from sizes: each would be wrong at other shapes if it were baked as a constant."""

    def forward(self, x):
        n, m = x.size(0), x.size(1)
        flat = x.view(x.size(0), -1)
        positions = torch.arange(m).to(x.dtype)
        half = x[:, : m // 2]
        zeros = x.new_zeros(n, 4)
        ones = x.new_ones([n, m])
        mask = (torch.arange(m) < m - 1).to(x.dtype)
        return flat * 2, x + positions, half.sum(1), zeros + n, ones * mask


@pytest.mark.parametrize("dynamic", ["batch", "both"])
def test_size_dependent_values_are_not_baked(dynamic):
    model = SizeArithmetic().eval()
    if dynamic == "batch":
        spec = torchkiln.Input(min_shape=(1, 6), opt_shape=(4, 6), max_shape=(8, 6))
        shapes = [(1, 6), (4, 6), (8, 6), (2, 6), (7, 6)]
    else:
        spec = torchkiln.Input(min_shape=(1, 2), opt_shape=(4, 6), max_shape=(8, 12))
        shapes = [(1, 2), (4, 6), (8, 12), (3, 9), (6, 3)]
    _one_engine_matching_eager(model, [spec], lambda s: [torch.randn(*s)], shapes)


def test_squeeze_of_a_dim_that_may_be_one_stays_in_pytorch():
    """squeeze(0) removes the dim only where it is 1: with a batch in [1, 4] the engine cannot know."""
    class Squeeze(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).squeeze(0) * 2 + 1

    model = Squeeze().eval()
    spec = torchkiln.Input(min_shape=(1, 3), opt_shape=(2, 3), max_shape=(4, 3))
    compiled, report = _compile(model, [spec], min_block_size=1)
    assert "aten::squeeze.dim" in report.fallback_ops, str(report)
    _check_at(model, compiled, lambda n: [torch.randn(n, 3)], [1, 2, 4, 3])


def _hidden(out):
    return out["last_hidden_state"] if isinstance(out, dict) else (out[0] if isinstance(out, (tuple, list)) else
                                                                   out.last_hidden_state)


class _WindowAttention(torch.nn.Module):
    """A Swin-style block over [B, H, W, C]: the map padded to whole windows, split into them, attention within each
    (4-D batched products of a dynamic leading dim, a bias broadcast over it), and the windows put back."""

    def __init__(self, c: int = 8, heads: int = 2, window: int = 4) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv = torch.nn.Linear(c, 3 * c)
        self.bias = torch.nn.Parameter(torch.randn(1, heads, window * window, window * window))

    def forward(self, x):
        b, h, w, c = x.shape
        ws = self.window
        x = torch.nn.functional.pad(x, (0, 0, 0, (ws - w % ws) % ws, 0, (ws - h % ws) % ws))
        _, ph, pw, _ = x.shape
        x = x.view(b, ph // ws, ws, pw // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        q, k, v = self.qkv(x).reshape(x.size(0), ws * ws, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q.matmul(k.transpose(-2, -1)) * 0.5 + self.bias, dim=-1)
        x = attn.matmul(v).transpose(1, 2).reshape(-1, ws * ws, c)
        x = x.view(b, ph // ws, pw // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, ph, pw, c)
        return x[:, :h, :w, :]


def test_window_attention_with_padding_and_a_dynamic_batch_is_one_engine():
    """The padding's and the batched products' output shapes are read off their input shapes: torch's fake
    constant_pad_nd and matmul ask for every size as an int, which left each such layer (and the shuffles after it,
    their dims' relation lost) in PyTorch: 16 engines for torchvision's swin_t."""
    torch.manual_seed(0)
    model = _WindowAttention().eval()
    spec = torchkiln.Input(min_shape=(1, 10, 10, 8), opt_shape=(2, 10, 10, 8), max_shape=(4, 10, 10, 8))
    _one_engine_matching_eager(model, [spec], lambda b: [torch.randn(b, 10, 10, 8)], [1, 2, 3, 4])


class _Upsampling(torch.nn.Module):
    """A segmentation head's resizes: by a factor, then to the input's (static) spatial size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        y = torch.nn.functional.interpolate(self.conv(x), scale_factor=2.0, mode="bilinear", align_corners=False)
        return torch.nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False) + x[:, :1]


class _ResizeBack(torch.nn.Module):
    """A segmentation head's last step: scores at a stride, resized to the input's size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False) * 2.0


def test_a_resize_back_to_a_dynamic_input_size_is_one_engine():
    """A resize to the input's size, which is dynamic: the output's spatial dims are the layer's `size`."""
    torch.manual_seed(0)
    model = _ResizeBack().eval()
    spec = torchkiln.Input(min_shape=(1, 3, 12, 12), opt_shape=(2, 3, 15, 15), max_shape=(2, 3, 20, 20))
    _one_engine_matching_eager(model, [spec], lambda shape: [torch.randn(*shape)],
                               [(1, 3, 12, 12), (2, 3, 13, 19), (2, 3, 20, 20)])


def test_resizes_of_a_map_with_a_dynamic_batch_are_one_engine():
    """A resize's output shape is read off its input's where the spatial dims are static (torch's fake upsampling
    asks for every size as an int)."""
    torch.manual_seed(0)
    model = _Upsampling().eval()
    spec = torchkiln.Input(min_shape=(1, 3, 15, 15), opt_shape=(2, 3, 15, 15), max_shape=(4, 3, 15, 15))
    _one_engine_matching_eager(model, [spec], lambda b: [torch.randn(b, 3, 15, 15)], [1, 3, 4])


class _TracedSizes(torch.nn.Module):
    """Size arithmetic as tracing records it (transformers' MobileViT unfolds patches so): 0-d tensors of the dims,
    a dynamic one times static ones, and a static one through ceil, a cast and a floor division."""

    def forward(self, x):
        b, c, h, w = x.shape
        patches = (torch.ceil(w / 4) * 4).to(torch.int64) // 4
        return torch.relu(x).reshape(b * c * h, patches, 4).sum(-1)


def test_traced_size_arithmetic_of_dynamic_and_static_dims_is_one_engine():
    """`b * c` of a dynamic b and a static c, both 0-d tensors in a trace, is a symbolic dim: the products had been
    converted as tensor layers (and refused), leaving the reshape they size in PyTorch."""
    x = torch.randn(2, 3, 8, 12)
    traced = torch.jit.trace(_TracedSizes().eval(), x, check_trace=False)
    spec = torchkiln.Input(min_shape=(1, 3, 8, 12), opt_shape=(2, 3, 8, 12), max_shape=(4, 3, 8, 12))
    _one_engine_matching_eager(traced, [spec], lambda b: [torch.randn(b, 3, 8, 12)], [1, 3, 4])


class _ShiftRight(torch.nn.Module):
    """A decoder's inputs shifted right (BART, T5): writes into slices and a select of a new tensor."""

    def forward(self, ids):
        out = ids.new_zeros(ids.shape)
        out[:, 1:] = ids[:, :-1].clone()
        out[:, 0] = 2
        return out * 3 + 1


def test_writes_into_slices_of_dynamic_dims_are_one_engine():
    """The functionalized writes scatter into dims of sizes known only at run time, where the ranges settle the
    bounds (all of dim 0, dim 1 from 1, index 0 of dim 1): they had stayed in PyTorch."""
    spec = torchkiln.Input(min_shape=(1, 4), opt_shape=(2, 8), max_shape=(4, 16), dtype=torch.long)
    compiled, report = _compile(_ShiftRight(), [spec])
    assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, str(report)
    for shape in [(1, 4), (3, 9), (4, 16)]:
        ids = torch.randint(0, 100, shape)
        assert torch.equal(compiled(ids), _ShiftRight()(ids)), shape


class _TracedPositions(torch.nn.Module):
    """Position embeddings over a traced sequence length (BART's `arange(past, past + seq)`)."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = torch.nn.Embedding(40, 8)

    def forward(self, ids):
        return ids.unsqueeze(-1).float() + self.positions(torch.arange(2, 2 + ids.shape[1], dtype=torch.long))


def test_an_arange_over_a_traced_dynamic_length_is_one_engine():
    """A trace gives arange its end through ScalarImplicit of the length's 0-d tensor: a symbolic dim."""
    traced = torch.jit.trace(_TracedPositions().eval(), torch.randint(0, 9, (2, 8)), check_trace=False)
    spec = torchkiln.Input(min_shape=(1, 4), opt_shape=(2, 8), max_shape=(4, 16), dtype=torch.long)
    compiled, report = _compile(traced, [spec])
    assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, str(report)
    _check_at(traced, compiled, lambda shape: [torch.randint(0, 9, shape)], [(1, 4), (3, 9), (4, 16)])


def test_bert_dynamic_batch_and_sequence_with_attention_mask_is_one_engine():
    model = tiny_bert()
    spec = torchkiln.Input(min_shape=(1, 4), opt_shape=(2, 16), max_shape=(8, 64), dtype=torch.int64)
    compiled, report = _compile(model, [spec, spec])
    _assert_one_engine(report)
    for batch, seq in [(1, 4), (2, 16), (8, 64), (3, 9), (5, 40)]:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[0, seq // 2:] = 0  # padding in the first sequence
        args = [torch.randint(0, 1000, (batch, seq)), mask]
        with torch.no_grad():
            assert_matches_eager(_hidden(compiled(*args)), model(*args).last_hidden_state, path=f"{batch}x{seq}")
    if FULLY_SYMBOLIC:
        assert not report.reference_layers, report
        _assert_one_ort_session(compiled)


def test_gpt2_dynamic_sequence_is_one_engine():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    model = transformers.GPT2Model(config).eval()
    spec = torchkiln.Input(min_shape=(2, 4), opt_shape=(2, 16), max_shape=(2, 64), dtype=torch.int64)
    compiled, report = _compile(model, [spec])
    _assert_one_engine(report)
    for seq in [4, 16, 64, 9, 40]:
        ids = torch.randint(0, 1000, (2, seq))
        with torch.no_grad():
            assert_matches_eager(_hidden(compiled(ids)), model(ids).last_hidden_state, path=f"seq {seq}")
    if FULLY_SYMBOLIC:
        assert not report.reference_layers, report
        _assert_one_ort_session(compiled)
