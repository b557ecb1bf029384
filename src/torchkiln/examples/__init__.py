"""Models bundled for the demo and the tests (built in code, random weights)."""
from torchkiln.examples.models import MLP, SmallMobileNet, SmallResNet, SmallUNet
from torchkiln.examples.zoo import mobilenet_v2, resnet18

__all__ = ["MLP", "SmallMobileNet", "SmallResNet", "SmallUNet", "mobilenet_v2", "resnet18"]
