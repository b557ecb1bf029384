"""Frontend: whatever the user passes becomes a torch.jit.ScriptModule."""
from torchkiln.frontend.script import to_torchscript

__all__ = ["to_torchscript"]
