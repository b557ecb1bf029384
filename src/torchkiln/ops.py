"""torchkiln's own TorchScript ops, which lowering passes and models may use:

- `torchkiln::const(Tensor self) -> Tensor` marks a tensor as a build-time constant (the value itself).
- `torchkiln::attn_bias_from_attn_mask(Tensor attn_mask) -> Tensor` turns a boolean attention mask
  (True = attend) into an additive float32 bias: 0 where True, -inf where False; a float mask is
  already a bias and comes back unchanged.

They are Torch-TensorRT's `trt::const` and `trt::attn_bias_from_attn_mask` under torchkiln's own
namespace, so that a process may import torch_tensorrt and torchkiln together (docs/coverage.md).
"""
from __future__ import annotations

import torch

from torchkiln.runtime.execute_op import define_op, impl_op

_lib = torch.library.Library("torchkiln", "FRAGMENT")
define_op(_lib, "const(Tensor self) -> Tensor")
define_op(_lib, "attn_bias_from_attn_mask(Tensor attn_mask) -> Tensor")


def _const(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def _attn_bias_from_attn_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype != torch.bool:
        return mask.clone()
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))


impl_op(_lib, "const", _const, "CompositeExplicitAutograd")
impl_op(_lib, "attn_bias_from_attn_mask", _attn_bias_from_attn_mask, "CompositeExplicitAutograd")
