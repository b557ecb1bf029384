"""The model zoo: full-size models with random weights, for the benchmarks and scripts/zoo.py.

Two parts: ImageNet CNNs built in code as torchvision builds them (torchvision is not needed): ResNet-18 and
MobileNetV2; and the registry of zoo models by source (torchvision, timm, transformers, or bundled: built in code
here), with `load_zoo_model`, which gives each random-weight model meaningful outputs (no all-zero weight
matrices, batch-norm statistics calibrated on random inputs). `CPU_WAVE2` names a second, wider set of real
models at small sizes (segmentation, detection backbones, window attention, MLP-mixers, recurrent networks,
decoder-only LLM families) for `scripts/zoo.py --cpu-wave2`; `WIDE` names the wide benchmark set, real models at
their real sizes, for `python -m torchkiln bench --zoo wide`; `HOLDOUT` names more real models at real sizes,
of families the cuda backend's tuning never looked at, for `bench --zoo holdout`; `UNSEEN` names timm models added
after all that tuning, for `bench --zoo unseen`; `CPU` names real models at CPU sizes, for
`bench --zoo cpu`. No builder downloads weights.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn

from torchkiln.examples.blocks import BLOCKS, DiffusionBlock
from torchkiln.examples.cpu_models import ConvNeXt, MLPMixer, MobileNetV3Small, RegNetY
from torchkiln.examples.models import MLP, BasicBlock, SmallMobileNet, SmallResNet, randomize_batch_norm


class ResNet(nn.Module):
    """torchvision's ResNet with BasicBlocks: 7x7/2 stem, max pool, four stages, average pool, linear."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), widths: tuple[int, ...] = (64, 128, 256, 512),
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], widths[0]
        for i, (n, width) in enumerate(zip(blocks, widths)):
            stride = 1 if i == 0 else 2
            rest = [BasicBlock(width, width) for _ in range(n - 1)]
            stages.append(nn.Sequential(BasicBlock(cin, width, stride), *rest))
            cin = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        randomize_batch_norm(self)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet((2, 2, 2, 2), (64, 128, 256, 512), num_classes)


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU6(inplace=True)] if relu6 else layers


class InvertedResidualV2(nn.Module):
    """torchvision's MobileNetV2 block: 1x1 expand (unless the ratio is 1), 3x3 depthwise, 1x1 linear project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers = _conv_bn(cin, hidden, 1) if expand != 1 else []
        layers += _conv_bn(hidden, hidden, 3, stride, groups=hidden) + _conv_bn(hidden, cout, 1, relu6=False)
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0): 17 inverted residuals, 1280-channel head, dropout, linear."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # expand ratio, channels, repeats, first stride

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers, cin = _conv_bn(3, 32, 3, 2), 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidualV2(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += _conv_bn(cin, 1280, 1)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        randomize_batch_norm(self)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(x.flatten(1))


def mobilenet_v2(num_classes: int = 1000) -> MobileNetV2:
    return MobileNetV2(num_classes)


class LastHiddenState(nn.Module):
    """A transformers model returning its last hidden state as a tensor (what every peer can compile)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs).last_hidden_state


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: what provides it, how to build it (random weights), its inputs at a batch size."""

    name: str
    source: str  # "torchvision", "transformers" or "bundled"
    build: Callable[[], nn.Module]
    inputs: Callable[[int], list[torch.Tensor]]  # batch -> random example inputs, on the CPU
    max_batch: int | None = None  # the largest batch the benchmark runs it at (a larger one is capped); None: any


SOURCES = ("torchvision", "timm", "transformers", "bundled")  # the default search order of `find_zoo_model`


def _images(size: int = 224) -> Callable[[int], list[torch.Tensor]]:
    return lambda batch: [torch.randn(batch, 3, size, size)]


def import_torchvision():
    """torchvision, also where its compiled ops cannot load: PyPI's wheels are built against CUDA torch, so with
    a CPU torch the C extension fails to load and the import then fails registering meta kernels of
    `torchvision::nms` and `qnms`; declaring those two schemas (no kernels: calling them raises) lets the
    pure-Python models import. Detection heads that run nms stay unusable there."""
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::nms does not exist" not in str(e):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _SCHEMA_ONLY_LIBRARIES.append(library)  # the definitions live as long as the library object
        import torchvision
    return torchvision


_SCHEMA_ONLY_LIBRARIES: list[torch.library.Library] = []


def _torchvision(name: str, size: int = 224, **kwargs) -> ZooModel:
    def build() -> nn.Module:
        return getattr(import_torchvision().models, name)(weights=None, **kwargs)
    return ZooModel(name, "torchvision", build, _images(size))


def _token_inputs(vocab: int, seq: int) -> Callable[[int], list[torch.Tensor]]:
    """input_ids (int64, [batch, seq]) and an attention mask with the last quarter of every other row padded."""
    def inputs(batch: int) -> list[torch.Tensor]:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[1::2, seq - seq // 4:] = 0
        return [torch.randint(0, vocab, (batch, seq)), mask]
    return inputs


def import_transformers():
    """transformers, after `import_torchvision` where torchvision is installed: transformers imports torchvision,
    which with a CPU torch and PyPI's CUDA-built torchvision fails unless its op schemas were declared first."""
    if importlib.util.find_spec("torchvision") is not None:
        import_torchvision()
    import transformers

    return transformers


def _bert_base() -> nn.Module:
    transformers = import_transformers()
    return LastHiddenState(transformers.BertModel(transformers.BertConfig()))  # bert-base's shape


def _gpt2() -> nn.Module:
    transformers = import_transformers()
    return LastHiddenState(transformers.GPT2Model(transformers.GPT2Config(use_cache=False)))  # gpt2 (124M)


ZOO: dict[str, dict[str, ZooModel]] = {
    "torchvision": {m.name: m for m in map(_torchvision, (
        "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "densenet121", "vit_b_16",
        "convnext_tiny"))},
    "transformers": {
        "bert-base": ZooModel("bert-base", "transformers", _bert_base, _token_inputs(30522, 128)),
        "gpt2": ZooModel("gpt2", "transformers", _gpt2, lambda batch: [torch.randint(0, 50257, (batch, 128))]),
    },
    "bundled": {
        "resnet18": ZooModel("resnet18", "bundled", resnet18, _images()),
        "mobilenet_v2": ZooModel("mobilenet_v2", "bundled", mobilenet_v2, _images()),
        "small_resnet": ZooModel("small_resnet", "bundled", SmallResNet, _images(64)),
        "small_mobilenet": ZooModel("small_mobilenet", "bundled", SmallMobileNet, _images(64)),
        "mlp": ZooModel("mlp", "bundled", MLP, lambda batch: [torch.randn(batch, 64)]),
    },
}


class SelectOutput(nn.Module):
    """One entry of a model's dict output (torchvision's segmentation models return {"out": ..., "aux": ...})."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[self.key]


class FeatureList(nn.Module):
    """A feature pyramid's levels as a list (a detection backbone returns them as an ordered dict)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.model(x).values())


class ConcatenatedLevels(FeatureList):
    """A feature pyramid's levels, each flattened per image, concatenated: [batch, sum of C*H*W] (the benchmark
    compares one output tensor)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([level.flatten(1) for level in self.model(x).values()], 1)


class RecurrentClassifier(nn.Module):
    """Token embedding, a two-layer bidirectional batch-first LSTM or GRU, and a linear head on the last step."""

    def __init__(self, cell: str = "lstm", vocab: int = 1000, dim: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(dim, dim, num_layers=2, batch_first=True,
                                                           bidirectional=True)
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.head(out[:, -1])


def _timm(name: str, size: int = 64, **kwargs) -> ZooModel:
    def build() -> nn.Module:
        import_torchvision()  # timm imports torchvision
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)
    return ZooModel(name, "timm", build, _images(size))


def _segmentation(name: str, size: int = 64) -> ZooModel:
    def build() -> nn.Module:
        models = import_torchvision().models.segmentation
        return SelectOutput(getattr(models, name)(weights=None, weights_backbone=None, aux_loss=False), "out")
    return ZooModel(name, "torchvision", build, _images(size))


def _resnet_fpn(size: int = 64, backbone: str = "resnet18", output: type[FeatureList] = FeatureList,
                **kwargs) -> ZooModel:
    def build() -> nn.Module:
        backbone_utils = import_torchvision().models.detection.backbone_utils
        return output(backbone_utils.resnet_fpn_backbone(backbone_name=backbone, weights=None, trainable_layers=5,
                                                         **kwargs))
    return ZooModel(f"{backbone}_fpn_backbone", "torchvision", build, _images(size))


def _mobilenet_fpn(size: int = 64) -> ZooModel:
    def build() -> nn.Module:
        detection = import_torchvision().models.detection
        model = detection.fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None)
        return FeatureList(model.backbone)
    return ZooModel("fasterrcnn_mobilenet_v3_fpn_backbone", "torchvision", build, _images(size))


def _raft(variant: str = "raft_small", size: int = 64) -> ZooModel:
    def build() -> nn.Module:
        return getattr(import_torchvision().models.optical_flow, variant)(weights=None)
    return ZooModel(variant, "torchvision", build, lambda batch: [torch.randn(batch, 3, size, size),
                                                                  torch.randn(batch, 3, size, size)])


_TINY = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)  # the transformers configs' common names
_TINY_ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _transformer(name: str, model_class: str, config_class: str, seq: int = 16, masked: bool = True,
                 **config) -> ZooModel:
    """A transformers model from a tiny config (random weights), returning its last hidden state."""
    def build() -> nn.Module:
        transformers = import_transformers()
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
        return LastHiddenState(model)
    vocab = config.get("vocab_size", 1000)
    inputs = _token_inputs(vocab, seq) if masked else (lambda batch: [torch.randint(0, vocab, (batch, seq))])
    return ZooModel(name, "transformers", build, inputs)


def _transformers_model(name: str, model_class: str, config_class: str,
                        inputs: Callable[[int], list[torch.Tensor]], **config) -> ZooModel:
    """A transformers model from a config (random weights) on inputs other than tokens, returning its last hidden
    state."""
    def build() -> nn.Module:
        transformers = import_transformers()
        return LastHiddenState(getattr(transformers, model_class)(getattr(transformers, config_class)(**config)))
    return ZooModel(name, "transformers", build, inputs)


def _whisper_encoder(frames: int = 64) -> ZooModel:
    def build() -> nn.Module:
        transformers = import_transformers()
        config = transformers.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                            decoder_layers=2, decoder_attention_heads=4, encoder_ffn_dim=128,
                                            decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=frames // 2)
        return LastHiddenState(transformers.WhisperModel(config).get_encoder())
    return ZooModel("whisper_encoder", "transformers", build, lambda batch: [torch.randn(batch, 80, frames)])


_WAVE2: list[ZooModel] = [
    # torchvision: CNN families, window attention, segmentation, detection backbones, optical flow
    _torchvision("resnet34", 64), _torchvision("resnext50_32x4d", 64), _torchvision("wide_resnet50_2", 64),
    _torchvision("regnet_y_400mf", 64), _torchvision("shufflenet_v2_x1_0", 64), _torchvision("squeezenet1_1", 64),
    _torchvision("mnasnet0_5", 64), _torchvision("mobilenet_v3_small", 64), _torchvision("efficientnet_v2_s", 64),
    _torchvision("swin_t", 64), _torchvision("googlenet", 64, aux_logits=False, init_weights=True),
    _torchvision("inception_v3", 96, aux_logits=False, init_weights=True), _torchvision("vgg11_bn", 64),
    _torchvision("alexnet", 64), _segmentation("fcn_resnet50"), _segmentation("deeplabv3_mobilenet_v3_large"),
    _segmentation("lraspp_mobilenet_v3_large"), _resnet_fpn(), _mobilenet_fpn(), _raft("raft_small", 128),
    _raft("raft_large", 128),
    # timm: MLP-mixers, vision transformers, metaformers, hybrid attention, TF-"same" padding, multi-resolution
    _timm("mixer_s16_224", img_size=64), _timm("resmlp_12_224", img_size=64),
    _timm("vit_tiny_patch16_224", img_size=64), _timm("deit_tiny_patch16_224", img_size=64),
    _timm("convmixer_768_32"), _timm("poolformer_s12"), _timm("efficientformer_l1", 224),
    _timm("levit_128s", 224), _timm("coatnet_nano_rw_224", img_size=64), _timm("regnetz_b16"),
    _timm("cspresnet50"), _timm("ghostnet_100"), _timm("mobilevit_xxs"), _timm("tf_efficientnet_b0"),
    _timm("hrnet_w18_small"),
    # transformers: decoder-only LLM families, encoders, a speech encoder
    _transformer("gpt2-tiny", "GPT2Model", "GPT2Config", masked=False, vocab_size=1000, n_embd=64, n_layer=2,
                 n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0, use_cache=False),
    _transformer("opt-tiny", "OPTModel", "OPTConfig", masked=False, vocab_size=1000, hidden_size=64,
                 num_hidden_layers=2, num_attention_heads=4, ffn_dim=128, max_position_embeddings=64,
                 word_embed_proj_dim=64, use_cache=False),
    _transformer("llama-tiny", "LlamaModel", "LlamaConfig", masked=False, num_key_value_heads=2, use_cache=False,
                 **_TINY),
    _transformer("mistral-tiny", "MistralModel", "MistralConfig", masked=False, num_key_value_heads=2,
                 sliding_window=8, use_cache=False, **_TINY),
    _transformer("qwen2-tiny", "Qwen2Model", "Qwen2Config", masked=False, num_key_value_heads=2, use_cache=False,
                 **_TINY),
    _transformer("t5-encoder-tiny", "T5EncoderModel", "T5Config", vocab_size=1000, d_model=64, d_kv=16, d_ff=128,
                 num_layers=2, num_heads=4),
    _transformer("distilbert-tiny", "DistilBertModel", "DistilBertConfig", vocab_size=1000, dim=64, n_layers=2,
                 n_heads=4, hidden_dim=128, max_position_embeddings=64),
    _transformer("roberta-tiny", "RobertaModel", "RobertaConfig", **{**_TINY, "max_position_embeddings": 66}),
    _transformer("albert-tiny", "AlbertModel", "AlbertConfig", embedding_size=32, **_TINY),
    _whisper_encoder(),
    # transformers: what split in wave 3 (a permuted table written in place, in-place writes into reshaped views,
    # a custom autograd GELU, im2col and torch.multiply, a cat onto an empty cache)
    _transformers_model("beit-tiny", "BeitModel", "BeitConfig", _images(32), image_size=32, patch_size=8,
                        use_relative_position_bias=True, **_TINY_ENCODER),
    _transformers_model("data2vec-vision-tiny", "Data2VecVisionModel", "Data2VecVisionConfig", _images(32),
                        image_size=32, patch_size=8, use_relative_position_bias=True, **_TINY_ENCODER),
    _transformer("funnel-tiny", "FunnelModel", "FunnelConfig", vocab_size=1000, block_sizes=[1, 1], d_model=64,
                 n_head=4, d_head=16, d_inner=128, num_decoder_layers=1),
    _transformer("funnel-base-tiny", "FunnelBaseModel", "FunnelConfig", vocab_size=1000, block_sizes=[1, 1],
                 d_model=64, n_head=4, d_head=16, d_inner=128),
    _transformer("bloom-tiny", "BloomModel", "BloomConfig", masked=False, vocab_size=1000, hidden_size=64, n_layer=2,
                 n_head=4, use_cache=False),
    _transformer("convbert-tiny", "ConvBertModel", "ConvBertConfig", **_TINY),
    _transformer("xlm-tiny", "XLMModel", "XLMConfig", masked=False, vocab_size=1000, emb_dim=64, n_layers=2,
                 n_heads=4, max_position_embeddings=64),
    # bundled recurrent networks
    ZooModel("lstm_classifier", "bundled", RecurrentClassifier, lambda batch: [torch.randint(0, 1000, (batch, 16))]),
    ZooModel("gru_classifier", "bundled", lambda: RecurrentClassifier("gru"),
             lambda batch: [torch.randint(0, 1000, (batch, 16))]),
]
CPU_WAVE2 = tuple(m.name for m in _WAVE2)  # `scripts/zoo.py --cpu-wave2`: small inputs, CPU-sized


def _named(model: ZooModel, name: str | None = None, max_batch: int | None = None) -> ZooModel:
    """`model` under another zoo name (its size, where the name is taken at a smaller one) or with a largest batch."""
    return dataclasses.replace(model, name=name or model.name, max_batch=max_batch)


_WIDE: list[ZooModel] = [  # real models at their real sizes: 224x224 images, transformers at real widths
    # grouped convolutions; window attention (ZOO has depthwise + squeeze-excitation and ConvNeXt at 224 already)
    _named(_torchvision("resnext50_32x4d"), "resnext50_32x4d-224"), _torchvision("regnet_y_800mf"),
    _named(_torchvision("swin_t"), "swin_t-224"),
    # segmentation with upsampling; a detection backbone's feature pyramid; a DeiT
    _named(_segmentation("deeplabv3_mobilenet_v3_large", 224), "deeplabv3_mobilenet_v3_large-224"),
    _named(_segmentation("fcn_resnet50", 224), "fcn_resnet50-224"),
    _resnet_fpn(224, "resnet50", ConcatenatedLevels, norm_layer=nn.BatchNorm2d),  # calibrated, not frozen at 0, 1
    _timm("deit_small_patch16_224", 224),
    # a diffusion UNet's stage: GroupNorm ResBlock and spatial attention, [batch, 320, 32, 32]
    ZooModel("diffusion-block", "bundled", DiffusionBlock, lambda batch: [torch.randn(batch, 320, 32, 32)]),
    # encoders: roberta-base's and t5-small's configurations; decoder-only LLMs with RMSNorm, RoPE, GQA and SwiGLU
    # in Llama-3.2-1B's and Qwen2-0.5B's shapes (RoPE's base and scaling aside), at sequence 256 and batch <= 8
    _transformer("roberta-base", "RobertaModel", "RobertaConfig", seq=128, vocab_size=50265, hidden_size=768,
                 num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, max_position_embeddings=514,
                 type_vocab_size=1, pad_token_id=1),
    _transformer("t5-encoder-small", "T5EncoderModel", "T5Config", seq=512, vocab_size=32128, d_model=512, d_kv=64,
                 d_ff=2048, num_layers=6, num_heads=8),
    _named(_transformer("llama-3.2-1b", "LlamaModel", "LlamaConfig", seq=256, masked=False, vocab_size=128256,
                        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, max_position_embeddings=2048, use_cache=False), max_batch=8),
    _named(_transformer("qwen2-0.5b", "Qwen2Model", "Qwen2Config", seq=256, masked=False, vocab_size=151936,
                        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2, max_position_embeddings=2048, use_cache=False), max_batch=8),
]


def _whisper_encoder_256(frames: int = 200) -> ZooModel:
    def build() -> nn.Module:
        transformers = import_transformers()
        config = transformers.WhisperConfig(d_model=256, encoder_layers=4, encoder_attention_heads=4,
                                            decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=1024,
                                            decoder_ffn_dim=1024, num_mel_bins=80, max_source_positions=frames // 2)
        return LastHiddenState(transformers.WhisperModel(config).get_encoder())
    return ZooModel("whisper-encoder-256", "transformers", build, lambda batch: [torch.randn(batch, 80, frames)])


_SMALL_ENCODER = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
_CPU: list[ZooModel] = [  # real models at CPU sizes: 64-96 pixel images, encoders 256 wide at sequence 128
    ZooModel("resnet18-96", "bundled", resnet18, _images(96)),
    ZooModel("mobilenet_v2-96", "bundled", mobilenet_v2, _images(96)),
    ZooModel("regnet_y_400mf-96", "bundled", RegNetY, _images(96)),
    ZooModel("mobilenet_v3_small-96", "bundled", MobileNetV3Small, _images(96)),
    ZooModel("convnext-nano-64", "bundled", ConvNeXt, _images(64)),
    ZooModel("mlp-mixer-64", "bundled", MLPMixer, _images(64)),
    _transformer("bert-mini", "BertModel", "BertConfig", seq=128, vocab_size=30522, **_SMALL_ENCODER),
    _transformer("electra-small", "ElectraModel", "ElectraConfig", seq=128, vocab_size=30522, embedding_size=128,
                 hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024),
    _transformer("distilbert-mini", "DistilBertModel", "DistilBertConfig", seq=128, vocab_size=30522, dim=256,
                 n_layers=4, n_heads=4, hidden_dim=1024),
    _transformer("gpt2-mini", "GPT2Model", "GPT2Config", seq=128, masked=False, vocab_size=50257, n_embd=256,
                 n_layer=4, n_head=4, n_positions=128, use_cache=False),
    _transformers_model("vit-tiny-96", "ViTModel", "ViTConfig", _images(96), image_size=96, patch_size=16,
                        hidden_size=192, num_hidden_layers=6, num_attention_heads=3, intermediate_size=768),
    _transformers_model("wav2vec2-mini", "Wav2Vec2Model", "Wav2Vec2Config", lambda batch: [torch.randn(batch, 16000)],
                        conv_dim=(128,) * 7, **_SMALL_ENCODER),
    _whisper_encoder_256(),
]
_HOLDOUT: list[ZooModel] = [  # real models at real sizes that no tuning of the cuda backend has looked at
    # channel shuffles and splits; multi-axis attention; Swin V2's cosine attention and log-spaced position MLP;
    # fire modules (1x1 and 3x3 branches concatenated); a segmentation head with a sigmoid gate
    _named(_torchvision("shufflenet_v2_x1_0"), "shufflenet_v2_x1_0-224"), _torchvision("maxvit_t"),
    _named(_torchvision("swin_v2_t", 256), "swin_v2_t-256"),
    _named(_torchvision("squeezenet1_1"), "squeezenet1_1-224"),
    _named(_segmentation("lraspp_mobilenet_v3_large", 224), "lraspp_mobilenet_v3_large-224"),
    # transformers, in their published configurations (the configs' defaults where those are the model)
    _transformer("deberta-v3-base", "DebertaV2Model", "DebertaV2Config", seq=128, vocab_size=128100, hidden_size=768,
                 num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                 pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_biased_input=False,
                 type_vocab_size=0, layer_norm_eps=1e-7),
    _transformer("bart-base", "BartModel", "BartConfig", seq=128, vocab_size=50265, d_model=768, encoder_layers=6,
                 decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                 decoder_ffn_dim=3072, use_cache=False),
    _transformers_model("clip-vit-b32-vision", "CLIPVisionModel", "CLIPVisionConfig", _images(224), patch_size=32),
    _transformers_model("mobilevit-small", "MobileViTModel", "MobileViTConfig", _images(256)),
    _transformers_model("convnextv2-tiny", "ConvNextV2Model", "ConvNextV2Config", _images(224)),
    _transformers_model("segformer-b0-256", "SegformerModel", "SegformerConfig", _images(256)),
    _transformers_model("wav2vec2-base", "Wav2Vec2Model", "Wav2Vec2Config", lambda batch: [torch.randn(batch, 16000)]),
    # decoder-only LLMs: query/key norms (Qwen3), partial rotary with parallel attention and MLP (Phi-1.5)
    _named(_transformer("qwen3-0.6b", "Qwen3Model", "Qwen3Config", seq=256, masked=False, vocab_size=151936,
                        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, max_position_embeddings=2048, use_cache=False),
           max_batch=8),
    _named(_transformer("phi-1.5", "PhiModel", "PhiConfig", seq=256, masked=False, vocab_size=51200,
                        hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                        partial_rotary_factor=0.5, max_position_embeddings=2048, use_cache=False), max_batch=8),
]
_UNSEEN: list[ZooModel] = [  # timm models at their published input sizes, added (and first measured) after all
    # the tuning above: dense concatenation; multi-branch inception; split attention; multi-resolution fusion;
    # hierarchical channel splits; ghost modules; mixed kernel sizes; MobileNetV4; pooling mixers; cross-covariance
    # attention; spatial-reduction attention; locally-grouped and global attention; class attention with talking
    # heads; RoPE and SwiGLU in a ViT; focal modulation; a small hierarchical ViT with convolutions
    *(_named(_timm(name, size), f"{name}-{size}") for name, size in (
        ("densenet121", 224), ("inception_v3", 299), ("resnest14d", 224), ("hrnet_w18_small", 224),
        ("res2net50_14w_8s", 224), ("ghostnet_100", 224), ("mixnet_s", 224), ("mobilenetv4_conv_small", 224),
        ("poolformer_s12", 224), ("edgenext_small", 256), ("pvt_v2_b0", 224), ("twins_svt_small", 224),
        ("cait_xxs24_224", 224), ("eva02_tiny_patch14_224", 224), ("focalnet_tiny_srf", 224),
        ("tiny_vit_5m_224", 224))),
]
_UNSEEN2: list[ZooModel] = [  # the next 18 timm models at their published sizes, added after the unseen set's
    # changes and measured before any change for them: expansion with channel padding; dual paths; cross-stage
    # partial stages; deep aggregation; one-shot aggregation; stem blocks with learnable affine; scaled weight
    # standardization; star products; re-parameterized blocks; ReLU linear attention; LeViT's attention with
    # batch norms; global context attention; cross-covariance attention; conv-attention; separable linear
    # attention; two-branch cross attention; convolution and attention metaformers; dual attention; halo attention
    *(_named(_timm(name, size), f"{name}-{size}") for name, size in (
        ("rexnet_100", 224), ("dpn68", 224), ("cspdarknet53", 256), ("dla34", 224), ("ese_vovnet19b_dw", 224),
        ("hgnetv2_b0", 224), ("nf_resnet26", 224), ("starnet_s1", 224), ("repvit_m1_0", 224),
        ("efficientvit_b0", 224), ("levit_128", 224), ("gcvit_xxtiny", 224), ("xcit_nano_12_p16_224", 224),
        ("coat_lite_tiny", 224), ("mobilevitv2_050", 256), ("crossvit_tiny_240", 240), ("caformer_s18", 224),
        ("davit_tiny", 224), ("halonet26t", 256))),
]
HOLDOUT = tuple(m.name for m in _HOLDOUT)  # `python -m torchkiln bench --zoo holdout`
UNSEEN = tuple(m.name for m in _UNSEEN)  # `python -m torchkiln bench --zoo unseen`
UNSEEN2 = tuple(m.name for m in _UNSEEN2)  # `python -m torchkiln bench --zoo unseen2`
CPU = tuple(m.name for m in _CPU)  # `python -m torchkiln bench --zoo cpu --device cpu`
WIDE = (  # `python -m torchkiln bench --zoo wide`: the models above and four of ZOO's, by family
    "efficientnet_b0", "mobilenet_v3_large", "resnext50_32x4d-224", "regnet_y_800mf", "convnext_tiny", "swin_t-224",
    "deeplabv3_mobilenet_v3_large-224", "fcn_resnet50-224", "resnet50_fpn_backbone", "deit_small_patch16_224",
    "diffusion-block", "roberta-base", "t5-encoder-small", "gpt2", "llama-3.2-1b", "qwen2-0.5b")
ZOO.setdefault("timm", {})
for _model in _WAVE2 + _WIDE + _CPU + _HOLDOUT + _UNSEEN + _UNSEEN2:
    ZOO[_model.source][_model.name] = _model
for _name, (_build, _inputs) in BLOCKS.items():  # `python -m torchkiln bench --blocks`
    ZOO["bundled"][_name] = ZooModel(_name, "bundled", _build, _inputs)
_REQUIRES = {"torchvision": "torchvision", "timm": "timm", "transformers": "transformers"}  # source -> package


def source_unavailable(source: str) -> str | None:
    """Why a source cannot provide models here (its package is not installed), or None."""
    if source not in ZOO:
        return f"unknown model source {source!r}; use one of {list(ZOO)}"
    package = _REQUIRES.get(source)
    if package and importlib.util.find_spec(package) is None:
        return f"{package} is not installed"
    return None


def find_zoo_model(name: str, sources: Sequence[str] = SOURCES) -> ZooModel:
    """The first of `sources` that provides `name` and is available here; LookupError saying why none is."""
    reasons = []
    for source in sources:
        if name not in ZOO.get(source, {}):
            continue
        why = source_unavailable(source)
        if why is None:
            return ZOO[source][name]
        reasons.append(f"{source}: {why}")
    if not reasons:
        known = sorted({n for s in sources for n in ZOO.get(s, {})})
        raise LookupError(f"no model {name!r} in sources {list(sources)}; known: {known}")
    raise LookupError(f"model {name!r} is unavailable ({'; '.join(reasons)})")


def reinit_zero_weights(model: nn.Module) -> None:
    """Give all-zero weight matrices (torchvision's ViT head) and all-zero batch-norm gammas random values, so
    a random-weight model's output is not constant."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.weight is not None and not m.weight.any():
                m.weight.uniform_(0.5, 1.5)
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)


def calibrate_batch_norm(model: nn.Module, inputs: Callable[[], list[torch.Tensor]], passes: int = 4) -> None:
    """Set every batch norm's running statistics to the cumulative average over `passes` forward passes on
    `inputs()` in train mode, as after training (activations stay normalized through deep random networks);
    the model is left in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative moving average
        model.train()
        with torch.no_grad():
            for _ in range(passes):
                model(*inputs())
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
    model.eval()


def load_zoo_model(model: ZooModel, device: torch.device | str = "cpu", calibration_batch: int = 8) -> nn.Module:
    """The model built with random weights, made meaningful (`reinit_zero_weights`, `calibrate_batch_norm`),
    in eval mode on `device`."""
    module = model.build()
    reinit_zero_weights(module)
    module = module.to(device)
    calibrate_batch_norm(module, lambda: [x.to(device) for x in model.inputs(calibration_batch)])
    return module
