"""torchkiln: an ahead-of-time inference compiler for PyTorch (TorchScript in, engine-backed TorchScript out)."""
from torchkiln._version import __version__
from torchkiln.runtime import execute_op as _execute_op  # registers torch.ops.torchkiln.execute_engine
from torchkiln.settings import Input

__all__ = ["Input", "__version__"]
