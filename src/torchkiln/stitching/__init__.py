"""Stitching: engine blocks become calls to torch.ops.torchkiln.execute_engine in the module's graph."""
from torchkiln.stitching.stitch import stitch

__all__ = ["stitch"]
