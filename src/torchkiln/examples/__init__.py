"""Models bundled for the demo and the tests (built in code, random weights)."""
from torchkiln.examples.models import MLP, SmallMobileNet, SmallResNet, SmallUNet

__all__ = ["MLP", "SmallMobileNet", "SmallResNet", "SmallUNet"]
