"""Engines and how they run: the reference meaning of layers, the executor, safe engine bytes."""
from torchkiln.runtime import execute_op
from torchkiln.runtime.engine import Engine, InputBinding

__all__ = ["Engine", "InputBinding", "execute_op"]
