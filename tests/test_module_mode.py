"""Compiling leaves every submodule in the mode the user left it in."""
import torch
from torch import nn

import torchkiln


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * 2


def _modes(module: nn.Module) -> list[bool]:
    return [m.training for m in module.modules()]


def test_compile_keeps_each_submodule_mode():
    model = Wrapper()
    model.body.eval()  # the wrapper stays in training mode, its body is in eval mode
    before = _modes(model)
    assert before[0] and not any(before[1:])
    x = torch.randn(4, 8)
    compiled = torchkiln.compile(model, inputs=[torchkiln.Input((4, 8))], min_block_size=1)
    assert _modes(model) == before
    model.eval()
    torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-5)


def test_scripted_module_modes_are_restored():
    scripted = torch.jit.script(Wrapper())
    scripted.body.eval()
    before = _modes(scripted)
    torchkiln.compile(scripted, inputs=[torchkiln.Input((4, 8))], min_block_size=1)
    assert _modes(scripted) == before
