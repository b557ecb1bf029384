"""A module that cannot be scripted is traced: tracing's warnings reach the user as torchkiln warnings, and a
trace that baked in data-dependent values is refused instead of compiling to a constant."""
import logging
import types
import warnings

import pytest
import torch
from harness import assert_matches_eager, check_compiled

import torchkiln


class BakesNumpy(torch.nn.Module):
    """x.numpy() cannot be scripted; tracing records its result as a constant."""

    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2) + 1


class BakesBranch(torch.nn.Module):
    """A lambda cannot be scripted; the branch on the data is taken once, at trace time."""

    def forward(self, x):
        double = lambda t: t * 2  # noqa: E731
        if x.max() > 100:
            return double(x)
        return x - 1


class BakesShapeConstant(torch.nn.Module):
    """The trace is right for every input of this shape, but tracing still warns."""

    def forward(self, x):
        scale = lambda t: t * 3  # noqa: E731
        return scale(x) + torch.tensor(x.shape[1], dtype=torch.float32)


class Clean(torch.nn.Module):
    def forward(self, x, *rest):
        return torch.relu(x) * 2


@pytest.mark.parametrize("model, example", [(BakesNumpy(), torch.randn(2, 3)),
                                            (BakesBranch(), torch.full((2, 3), 1000.0)),
                                            (BakesNumpy(), torch.randn(2, 3).half()),
                                            (BakesBranch(), torch.full((2, 3), 1000.0, dtype=torch.bfloat16))],
                         ids=["numpy", "branch", "numpy-float16", "branch-bfloat16"])
def test_trace_that_bakes_in_data_is_refused(model, example):
    """Also in half precision, where the check allows for rounding (a baked-in trace is off by far more)."""
    with pytest.warns(torchkiln.TracingWarning, match="Converting a tensor to"):
        with pytest.raises(torchkiln.TracingError, match=rf"{type(model).__name__}.*baked.*scriptable"):
            torchkiln.compile(model, [example])


class ReturnsNamespace(torch.nn.Module):
    """Returns a Python object: neither TorchScript nor the tracer can hold it."""

    def forward(self, x):
        return types.SimpleNamespace(out=x * 2)


class FailsTraced(torch.nn.Module):
    """A lambda cannot be scripted; the forward raises only while traced (as code that branches on
    torch.jit.is_tracing() may)."""

    def forward(self, x):
        double = lambda t: t * 2  # noqa: E731
        if torch.jit.is_tracing():
            return double(x) + torch.ones(x.shape[0] + 1, 1)
        return double(x)


@pytest.mark.parametrize("model, cause", [(ReturnsNamespace(), "SimpleNamespace"),
                                          (FailsTraced(), "size of tensor a")], ids=["output", "forward"])
def test_a_module_the_tracer_cannot_trace_is_a_tracing_error(model, cause):
    """The tracer's own error (not a raw RuntimeError from inside torch.jit.trace) as torchkiln's TracingError,
    naming the module, why scripting failed, the tracer's cause and what to do."""
    with pytest.raises(torchkiln.TracingError,
                       match=rf"{type(model).__name__} could not be scripted \(.+\), and tracing .* failed: "
                             rf"RuntimeError: .*{cause}.*scriptable") as caught:
        torchkiln.compile(model, [torch.randn(2, 3)])
    assert len(str(caught.value)) < 1200  # the values the tracer printed are cut


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
def test_tracing_warning_is_surfaced_and_logged(caplog):
    model, x = BakesShapeConstant(), torch.randn(2, 3)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        with pytest.warns(torchkiln.TracingWarning, match="BakesShapeConstant.*torch.tensor results"):
            compiled = torchkiln.compile(model, [x])
    assert any("torch.tensor results" in r.getMessage() for r in caplog.records)
    y = torch.randn(2, 3)
    assert_matches_eager(compiled(y), model(y))


def test_clean_trace_compiles_without_warning(recwarn):
    model, x = Clean(), torch.randn(2, 3)
    compiled = torchkiln.compile(model, [x])
    assert not [w for w in recwarn if issubclass(w.category, torchkiln.TracingWarning)]
    y = torch.randn(2, 3)
    assert_matches_eager(compiled(y), model(y))


class TracedPathRoundsDifferently(torch.nn.Module):
    """Causal attention computed another way when traced, as transformers does (traced, it materialises the mask
    and SDPA then runs another kernel on CUDA): the same values, rounded differently in half precision. `**kwargs`
    keeps it from being scripted, as it does transformers' models."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x, **kwargs):
        q, k, v = self.qkv(x).chunk(3, -1)
        if torch.jit.is_tracing():
            n = x.shape[1]
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
            scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        else:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y)


# fp16 and bf16 against eager in the same precision: cosine >= 0.999 and max abs error <= this x max|eager|
HALF_RTOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_rounding_of_a_trace_is_not_baked_in_data(dtype):
    """The trace check's tolerance follows the precision: fp16 once refused a trace off by 4 units of fp16."""
    model = TracedPathRoundsDifferently().eval().to(dtype)
    x = torch.randn(2, 16, 32).to(dtype)
    compiled = torchkiln.compile(model, [x], enabled_precisions={dtype})
    y = torch.randn(2, 16, 32).to(dtype)
    with torch.no_grad():
        assert_matches_eager(compiled(y), model(y), rtol=HALF_RTOL[dtype], min_cosine=0.999)


def _bert(transformers):
    config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, 13:] = 0
    return transformers.BertModel(config), [torch.randint(0, 1000, (2, 16)), mask]


def _gpt2(transformers):
    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                     use_cache=False)
    return transformers.GPT2Model(config), [torch.randint(0, 1000, (2, 16))]


def _llama(transformers):
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                                      use_cache=False)
    return transformers.LlamaModel(config), [torch.randint(0, 1000, (2, 16))]


@pytest.mark.parametrize("build", [_bert, _gpt2, _llama], ids=lambda f: f.__name__[1:])
def test_float16_transformers_compile_and_match_eager(build):
    """model.half() on transformers' models (traced: they cannot be scripted), compiled for fp16."""
    model, example = build(pytest.importorskip("transformers"))
    model = model.eval().half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchkiln.TracingWarning)
        compiled = torchkiln.compile(model, example, enabled_precisions={torch.half})
    with torch.no_grad():
        assert_matches_eager(dict(compiled(*example)), dict(model(*example)), rtol=HALF_RTOL[torch.float16],
                             min_cosine=0.999)


class TracedIsCausal(torch.nn.Module):
    """transformers' sdpa_attention_forward: `is_causal` from the traced query length (a tensor under tracing), and
    `if torch.jit.is_tracing() and isinstance(is_causal, torch.Tensor): is_causal = is_causal.item()`."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)
        is_causal = q.shape[2] > 1 and True
        if torch.jit.is_tracing() and isinstance(is_causal, torch.Tensor):
            is_causal = is_causal.item()
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


class TracedTorchInt(torch.nn.Module):
    """transformers' interpolate_pos_encoding: sizes through `torch_int` (`x.to(torch.int64) if
    torch.jit.is_tracing() and isinstance(x, torch.Tensor) else int(x)`)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, 16, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def torch_int(n):
            return n.to(torch.int64) if torch.jit.is_tracing() and isinstance(n, torch.Tensor) else int(n)

        size = (torch_int(x.shape[-2] // 4), torch_int(x.shape[-1] // 4))
        return x[:, :, ::4, ::4] + torch.nn.functional.interpolate(self.pos, size=size, mode="bicubic")


@pytest.mark.parametrize("model, shape", [(TracedIsCausal, (2, 1, 16)), (TracedIsCausal, (2, 5, 16)),
                                          (TracedTorchInt, (2, 16, 24, 20))])
def test_isinstance_guarded_reads_of_traced_sizes_are_one_engine(model, shape):
    """The isinstance-guarded branches transformers takes on a traced size's data read a static value."""
    x = torch.randn(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model().eval(), (x,))
    check_compiled(traced, [x])
