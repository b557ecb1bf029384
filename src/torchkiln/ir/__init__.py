"""The engine IR: a TensorRT-shaped network of typed layers over named tensors."""
from torchkiln.ir import layers
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor

__all__ = ["Network", "Tensor", "layers"]
