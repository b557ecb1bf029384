"""Models bundled for the demo and the tests (built in code, random weights)."""
from torchkiln.examples.models import MLP, SmallResNet

__all__ = ["MLP", "SmallResNet"]
