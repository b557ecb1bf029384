"""The engine IR: a TensorRT-shaped network of typed layers over named tensors."""
from torchkiln.network import layers
from torchkiln.network.network import Network
from torchkiln.network.tensor import Tensor

__all__ = ["Network", "Tensor", "layers"]
