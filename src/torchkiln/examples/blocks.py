"""Generic blocks of real models, for `python -m torchkiln bench --blocks`: each a small module in the shapes a real
model runs it at, with random weights that give meaningful outputs. No block is tuned for: they are the shapes of
work (norms, softmax, gated MLPs, squeeze-excitation, depthwise convolutions, rotary embeddings, grouped-query
attention, feature-pyramid merges) that any model is made of."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchkiln.examples.models import randomize_batch_norm


class RMSNormSwiGLU(nn.Module):
    """A decoder-only LLM's MLP sublayer: x + down(silu(gate(rms(x))) * up(rms(x)))."""

    def __init__(self, d: int = 1024, hidden: int = 2816) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class ConvNeXtBlock(nn.Module):
    """depthwise 7x7 -> channels-last layer norm -> MLP with GELU -> layer scale -> residual."""

    def __init__(self, c: int = 192) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) * 0.5 + 0.5)

    def forward(self, x):
        h = self.norm(self.dw(x).permute(0, 2, 3, 1))
        h = self.fc2(F.gelu(self.fc1(h))) * self.gamma
        return x + h.permute(0, 3, 1, 2)


class GroupNormResBlock(nn.Module):
    """A diffusion UNet's residual block: (GroupNorm -> SiLU -> 3x3 conv) twice, plus the input."""

    def __init__(self, c: int = 128, groups: int = 32) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(groups, c), nn.GroupNorm(groups, c)
        self.conv1, self.conv2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class HandAttention(nn.Module):
    """Attention written by hand: softmax(q k^T / sqrt(d) + mask) v, over projections of x."""

    def __init__(self, d: int = 768, heads: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5 + mask
        return self.out((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d))


class SqueezeExcite(nn.Module):
    """An inverted residual's squeeze-excitation: global mean -> 1x1 reduce -> SiLU -> 1x1 expand -> sigmoid gate."""

    def __init__(self, c: int = 240, squeezed: int = 10) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class LayerNormGeLUMLP(nn.Module):
    """A pre-norm transformer's MLP sublayer: x + fc2(gelu(fc1(layer_norm(x))))."""

    def __init__(self, d: int = 768) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TanhGeluMLP(nn.Module):
    """A decoder's MLP sublayer with its weights stored [in, out] (x @ W + b) and GELU's tanh form written out, pow
    included: x + (gelu_tanh(x @ W1 + b1) @ W2 + b2)."""

    def __init__(self, d: int = 768) -> None:
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(d, 4 * d) * d ** -0.5), nn.Parameter(torch.randn(4 * d) * 0.1)
        self.w2, self.b2 = nn.Parameter(torch.randn(4 * d, d) * (4 * d) ** -0.5), nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        h = x @ self.w1 + self.b1
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + (h @ self.w2 + self.b2)


class DiffusionBlock(nn.Module):
    """A diffusion UNet's stage at one resolution: a GroupNorm ResBlock, then spatial self-attention over its H*W
    positions (GroupNorm -> 1x1 q, k, v -> multi-head scaled dot-product attention -> 1x1 projection -> residual),
    in Stable Diffusion's first-stage width (320 channels, 8 heads)."""

    def __init__(self, c: int = 320, heads: int = 8, groups: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.res = GroupNormResBlock(c, groups)
        self.norm = nn.GroupNorm(groups, c)
        self.qkv, self.out = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        x = self.res(x)
        b, c, h, w = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).transpose(-2, -1)
        a = F.scaled_dot_product_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2])  # [b, heads, h * w, c // heads]
        return x + self.out(a.transpose(-2, -1).reshape(b, c, h, w))


class FPNMerge(nn.Module):
    """A top-down step of torchvision's FeaturePyramidNetwork (Faster/Mask R-CNN, RetinaNet): lateral 1x1 conv of the
    finer backbone map + the coarser merged map upsampled 2x (nearest) -> 3x3 output conv."""

    def __init__(self, c_in: int = 512, c: int = 256) -> None:
        super().__init__()
        self.inner, self.layer = nn.Conv2d(c_in, c, 1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, finer, coarser):
        lateral = self.inner(finer)
        return self.layer(lateral + F.interpolate(coarser, size=lateral.shape[-2:], mode="nearest"))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The second half of the last dim negated, then the first: Llama's rotation of pairs (i, i + d/2)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class RoPEAttention(nn.Module):
    """Llama's, Mistral's and Qwen's (Hugging Face) causal self-attention with rotary embeddings: q and k times cos +
    rotate_half times sin of positions x inverse frequencies, then SDPA and the output projection."""

    def __init__(self, d: int = 1024, heads: int = 16, base: float = 10000.0) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        inv_freq = 1.0 / base ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        freqs = torch.outer(torch.arange(s, device=x.device).float(), self.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, d))


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, kv_heads, s, d] -> [b, kv_heads * groups, s, d], each key/value head repeated for its query heads."""
    b, kv_heads, s, head_dim = x.shape
    return x[:, :, None].expand(b, kv_heads, groups, s, head_dim).reshape(b, kv_heads * groups, s, head_dim)


class GQAttention(nn.Module):
    """Llama's, Mistral's and Qwen2's causal grouped-query self-attention: 4 key/value heads for 16 query heads,
    repeated to them (repeat_kv: expand + reshape), then SDPA and the output projection."""

    def __init__(self, d: int = 1024, heads: int = 16, kv_heads: int = 4) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        groups = self.heads // self.kv_heads
        a = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, d))


class DepthwiseSeparable(nn.Module):
    """MobileNetV1's depthwise-separable convolution (its 56x56 stage, 128 channels): 3x3 depthwise conv -> batch
    norm -> ReLU6 -> 1x1 pointwise conv -> batch norm -> ReLU6."""

    def __init__(self, c_in: int = 128, c_out: int = 128) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c_in, c_in, 3, padding=1, groups=c_in, bias=False)
        self.pw = nn.Conv2d(c_in, c_out, 1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(c_in), nn.BatchNorm2d(c_out)
        randomize_batch_norm(self)

    def forward(self, x):
        return F.relu6(self.bn2(self.pw(F.relu6(self.bn1(self.dw(x))))))


def _mask(batch: int, seq: int) -> torch.Tensor:
    """An additive padding mask: the last quarter of every other sequence masked."""
    mask = torch.zeros(batch, 1, 1, seq)
    mask[::2, ..., seq - seq // 4:] = float("-inf")
    return mask


BLOCKS = {  # name -> (module builder, inputs at a batch size)
    "block-rmsnorm-swiglu": (RMSNormSwiGLU, lambda batch: [torch.randn(batch, 512, 1024)]),
    "block-convnext": (ConvNeXtBlock, lambda batch: [torch.randn(batch, 192, 56, 56)]),
    "block-groupnorm-resblock": (GroupNormResBlock, lambda batch: [torch.randn(batch, 128, 64, 64)]),
    "block-attention": (HandAttention, lambda batch: [torch.randn(batch, 128, 768), _mask(batch, 128)]),
    "block-squeeze-excite": (SqueezeExcite, lambda batch: [torch.randn(batch, 240, 28, 28)]),
    "block-layernorm-mlp": (LayerNormGeLUMLP, lambda batch: [torch.randn(batch, 197, 768)]),
    "block-tanh-gelu-mlp": (TanhGeluMLP, lambda batch: [torch.randn(batch, 128, 768)]),
    "block-fpn-merge": (FPNMerge, lambda batch: [torch.randn(batch, 512, 28, 28), torch.randn(batch, 256, 14, 14)]),
    "block-rope-attention": (RoPEAttention, lambda batch: [torch.randn(batch, 256, 1024)]),
    "block-gqa-attention": (GQAttention, lambda batch: [torch.randn(batch, 256, 1024)]),
    "block-depthwise-separable": (DepthwiseSeparable, lambda batch: [torch.randn(batch, 128, 56, 56)]),
}
