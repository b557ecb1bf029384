"""The model zoo in CI: real architectures (random weights, small configs) compile to one engine with no
fallback and match eager."""
import pytest
import torch
from harness import check_compiled

from torchkiln.examples import SmallMobileNet, SmallResNet, SmallUNet

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


def resnet():
    return SmallResNet(), [torch.randn(2, 3, 64, 64)]


def mobilenet():
    return SmallMobileNet(), [torch.randn(2, 3, 64, 64)]


def unet():
    return SmallUNet(), [torch.randn(1, 3, 32, 32)]


@pytest.mark.parametrize("build", [bert, gpt2, distilbert, t5_encoder, vit, resnet, mobilenet, unet],
                         ids=lambda f: f.__name__)
def test_zoo_model_is_one_engine_and_matches_eager(build):
    model, example = build()
    check_compiled(model, example, engines=1, torch_blocks=0)
