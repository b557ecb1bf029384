"""The builder: optimizes a network (folding, fusion, precision) into an Engine."""
from torchkiln.builder.builder import build_engine
from torchkiln.builder.settings import BuildSettings

__all__ = ["BuildSettings", "build_engine"]
