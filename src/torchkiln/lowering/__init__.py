"""Lowering: freeze the module and simplify its graph toward ops that convert one to one."""
from torchkiln.lowering.pipeline import LoweredModule, lower

__all__ = ["LoweredModule", "lower"]
