"""Frontend: whatever the user passes becomes a torch.jit.ScriptModule."""
from torchkiln.frontend.script import as_module, check_method, to_torchscript

__all__ = ["as_module", "check_method", "to_torchscript"]
