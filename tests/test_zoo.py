"""The model zoo in CI: real architectures (random weights, small configs) compile to one engine with no
fallback and match eager."""
import pytest
import torch
from harness import check_compiled

from torchkiln.examples import SmallMobileNet, SmallResNet, SmallUNet
from torchkiln.examples.blocks import BLOCKS

transformers = pytest.importorskip("transformers")


def _ids(batch: int = 2, seq: int = 16, vocab: int = 1000) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def _mask(batch: int = 2, seq: int = 16) -> torch.Tensor:
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq - 3:] = 0  # padding in the first sequence
    return mask


def bert():
    config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    return transformers.BertModel(config), [_ids(), _mask()]


def gpt2():
    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                     use_cache=False)
    return transformers.GPT2Model(config), [_ids()]


def distilbert():
    config = transformers.DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                           max_position_embeddings=64)
    return transformers.DistilBertModel(config), [_ids(), _mask()]


def t5_encoder():
    config = transformers.T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    return transformers.T5EncoderModel(config), [_ids()]


def vit():
    config = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return transformers.ViTModel(config), [torch.randn(2, 3, 32, 32)]


def beit():
    """BEiT with its relative position bias, which writes a permuted coordinate table in place."""
    config = transformers.BeitConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128, use_relative_position_bias=True)
    return transformers.BeitModel(config), [torch.randn(2, 3, 32, 32)]


def funnel():
    """Funnel: relative attention scores shifted by reshapes, then masked in place (`positional_attn *= cls_mask`)."""
    config = transformers.FunnelConfig(vocab_size=1000, block_sizes=[1, 1], d_model=64, n_head=4, d_head=16,
                                       d_inner=128, num_decoder_layers=1)
    return transformers.FunnelModel(config), [_ids()]


def bloom():
    """BLOOM: its GELU is a custom autograd Function (GeLUFunction), inlined from its forward."""
    config = transformers.BloomConfig(vocab_size=1000, hidden_size=64, n_layer=2, n_head=4, use_cache=False)
    return transformers.BloomModel(config), [_ids()]


def convbert():
    """ConvBERT: span-based convolution by F.unfold (aten::im2col) and torch.multiply."""
    config = transformers.ConvBertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=64)
    return transformers.ConvBertModel(config), [_ids(), _mask()]


def resnet():
    return SmallResNet(), [torch.randn(2, 3, 64, 64)]


def mobilenet():
    return SmallMobileNet(), [torch.randn(2, 3, 64, 64)]


def unet():
    return SmallUNet(), [torch.randn(1, 3, 32, 32)]


def diffusion_block():
    """The wide set's diffusion block (GroupNorm ResBlock, spatial SDPA attention) at 64 channels, 8x8."""
    from torchkiln.examples.blocks import DiffusionBlock

    return DiffusionBlock(64, heads=4, groups=16), [torch.randn(2, 64, 8, 8)]


def electra():
    config = transformers.ElectraConfig(vocab_size=1000, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    return transformers.ElectraModel(config), [_ids(), _mask()]


def wav2vec2():
    config = transformers.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, conv_dim=(32,) * 7, num_conv_pos_embeddings=16)
    return transformers.Wav2Vec2Model(config), [torch.randn(2, 1600)]


def regnet_y():
    from torchkiln.examples.cpu_models import RegNetY

    return RegNetY((1, 2), (16, 32), group_width=8, num_classes=10), [torch.randn(2, 3, 32, 32)]


def mobilenet_v3_small():
    from torchkiln.examples.cpu_models import MobileNetV3Small

    return MobileNetV3Small(num_classes=10), [torch.randn(2, 3, 32, 32)]


def convnext():
    from torchkiln.examples.cpu_models import ConvNeXt

    return ConvNeXt((1, 1), (16, 32), num_classes=10), [torch.randn(2, 3, 32, 32)]


def mlp_mixer():
    from torchkiln.examples.cpu_models import MLPMixer

    return MLPMixer(32, 8, 32, 2, 16, 64, num_classes=10), [torch.randn(2, 3, 32, 32)]


@pytest.mark.parametrize("build", [bert, gpt2, distilbert, t5_encoder, vit, electra, wav2vec2, beit, funnel, bloom,
                                   convbert, resnet, mobilenet, unet, diffusion_block, regnet_y, mobilenet_v3_small,
                                   convnext, mlp_mixer],
                         ids=lambda f: f.__name__)
def test_zoo_model_is_one_engine_and_matches_eager(build):
    model, example = build()
    _, report = check_compiled(model, example, engines=1, torch_blocks=0)
    assert not report.reference_layers, report  # on the onnxruntime backend (the default on the CPU): one session


class EncoderBlock(torch.nn.Module):
    """torchvision's ViT encoder block: pre-norm nn.MultiheadAttention and MLP, with dropouts and an assert."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = torch.nn.MultiheadAttention(dim, heads, dropout=0.1, batch_first=True)
        self.dropout = torch.nn.Dropout(0.1)
        self.ln_2 = torch.nn.LayerNorm(dim, eps=1e-6)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(2 * dim, dim), torch.nn.Dropout(0.1))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(torch.nn.Module):
    """A small ViT written as torchvision's is (scripted): patchify conv, class token, position embedding."""

    def __init__(self, image: int = 32, patch: int = 8, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim = image, patch, dim
        self.conv_proj = torch.nn.Conv2d(3, dim, patch, patch)
        self.class_token = torch.nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embedding = torch.nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = torch.nn.Sequential(*[EncoderBlock(dim, heads) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(dim, eps=1e-6)
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        torch._assert(h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!")
        x = self.conv_proj(x).reshape(n, self.hidden_dim, (h // self.patch_size) * (w // self.patch_size))
        x = torch.cat([self.class_token.expand(n, -1, -1), x.permute(0, 2, 1)], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


def test_scripted_torchvision_style_vit_is_one_engine():
    with torch.no_grad():  # the inference path (nn.MultiheadAttention's fast path) eager takes
        check_compiled(torch.jit.script(VisionTransformer().eval()), [torch.randn(2, 3, 32, 32)])


def test_calibrated_batch_norm_normalizes_the_calibration_data():
    from torchkiln.examples.zoo import calibrate_batch_norm

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8, momentum=0.3))
    x = 5 + 3 * torch.randn(16, 3, 12, 12)
    calibrate_batch_norm(model, lambda: [x], passes=3)
    assert not model.training and model[1].momentum == 0.3
    with torch.no_grad():
        out = model(x)
    assert out.mean(dim=(0, 2, 3)).abs().max() < 1e-4
    assert (out.var(dim=(0, 2, 3)) - 1).abs().max() < 1e-3


def test_zero_weights_and_gammas_get_random_values():
    from torchkiln.examples.zoo import reinit_zero_weights

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        model[1].weight.zero_()
        model[2].weight.zero_()
        model[2].bias.zero_()
    kept = model[0].weight.clone()
    reinit_zero_weights(model)
    assert model[1].weight.min() >= 0.5 and model[2].weight.abs().min() > 0
    assert torch.equal(model[0].weight, kept) and not model[2].bias.any()  # only all-zero matrices and gammas


def test_zoo_models_come_from_the_first_available_source():
    from torchkiln.examples.zoo import find_zoo_model, load_zoo_model, source_unavailable

    assert find_zoo_model("mobilenet_v2", ["bundled"]).source == "bundled"
    with pytest.raises(LookupError, match="no model 'resnet50'"):
        find_zoo_model("resnet50", ["bundled"])
    if source_unavailable("torchvision"):
        assert find_zoo_model("mobilenet_v2").source == "bundled"
        with pytest.raises(LookupError, match="torchvision is not installed"):
            find_zoo_model("resnet50")
    zoo_model = find_zoo_model("small_resnet")
    model = load_zoo_model(zoo_model)
    with torch.no_grad():
        out = model(*zoo_model.inputs(2))
    assert not model.training and out.shape == (2, 10) and out.std() > 0


def test_cpu_wave2_names_models_each_source_provides():
    from torchkiln.examples.zoo import CPU_WAVE2, ZOO, find_zoo_model, load_zoo_model, source_unavailable

    assert len(CPU_WAVE2) >= 30 and len(set(CPU_WAVE2)) == len(CPU_WAVE2)
    holders = {name: [s for s in ZOO if name in ZOO[s]] for name in CPU_WAVE2}
    assert all(len(sources) == 1 for sources in holders.values()), holders
    assert {s for (s,) in holders.values()} == {"torchvision", "timm", "transformers", "bundled"}
    if source_unavailable("timm"):
        with pytest.raises(LookupError, match="timm is not installed"):
            find_zoo_model("mixer_s16_224")
    zoo_model = find_zoo_model("lstm_classifier")
    model = load_zoo_model(zoo_model)
    with torch.no_grad():
        out = model(*zoo_model.inputs(2))
    assert out.shape == (2, 10) and out.std() > 0


WIDE_FAMILIES = {  # what `bench --zoo wide` must span (issue 24), family -> its models
    "depthwise convolutions with squeeze-excitation": {"efficientnet_b0", "mobilenet_v3_large"},
    "grouped convolutions": {"resnext50_32x4d-224", "regnet_y_800mf"},
    "ConvNeXt blocks": {"convnext_tiny"},
    "window attention": {"swin_t-224"},
    "segmentation with upsampling": {"deeplabv3_mobilenet_v3_large-224", "fcn_resnet50-224"},
    "detection backbone with FPN": {"resnet50_fpn_backbone"},
    "ViT/DeiT": {"deit_small_patch16_224"},
    "diffusion UNet stage (GroupNorm, SiLU, attention)": {"diffusion-block"},
    "BERT-family and T5 encoders": {"roberta-base", "t5-encoder-small"},
    "GPT-2": {"gpt2"},
    "decoder-only LLMs (RMSNorm, RoPE, GQA, SwiGLU)": {"llama-3.2-1b", "qwen2-0.5b"},
}


def test_wide_set_spans_the_families_at_real_sizes():
    """Names and inputs only: the full-size models are built by `bench --zoo wide`, not here."""
    from torchkiln.bench.compare import DEFAULT_MODELS
    from torchkiln.examples.zoo import CPU_WAVE2, WIDE, ZOO

    assert len(WIDE) >= 16 and len(set(WIDE)) == len(WIDE)
    assert set().union(*WIDE_FAMILIES.values()) == set(WIDE)
    assert not set(WIDE) & (set(DEFAULT_MODELS) | set(CPU_WAVE2))
    holders = {name: [ZOO[s][name] for s in ZOO if name in ZOO[s]] for name in WIDE}
    assert all(len(models) == 1 for models in holders.values()), holders
    for name, (model,) in holders.items():
        first = model.inputs(1)[0]
        if model.source in ("torchvision", "timm"):
            assert first.shape == (1, 3, 224, 224), name
        elif model.source == "transformers":
            assert first.dtype == torch.int64 and 128 <= first.shape[1] <= 512, name
        assert model.max_batch == (8 if name in WIDE_FAMILIES["decoder-only LLMs (RMSNorm, RoPE, GQA, SwiGLU)"]
                                   else None), name
    assert ZOO["torchvision"]["swin_t"].inputs(1)[0].shape[-1] == 64  # the CPU wave-2 model of that name stays


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_every_benchmark_block_is_one_engine_and_matches_eager(name):
    """`bench --blocks`' blocks, at batch 1 on the CPU: each becomes one engine with eager's values."""
    build, inputs = BLOCKS[name]
    torch.manual_seed(0)
    check_compiled(build().eval(), inputs(1), engines=1, torch_blocks=0)


@pytest.mark.parametrize("build", [regnet_y, mobilenet_v3_small, convnext, mlp_mixer], ids=lambda f: f.__name__)
def test_the_models_built_in_code_script(build):
    """The CPU zoo's own models script (the frontend traces a module it cannot script, and warns)."""
    model, example = build()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(*example), model(*example), rtol=0, atol=0)
