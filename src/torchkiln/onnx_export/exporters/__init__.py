"""One exporter per layer kind, grouped by family; importing this package registers them all."""
from torchkiln.onnx_export.exporters import (control_flow, data_dependent, elementwise, nn, quantize,  # noqa: F401
                                             tensor)
