"""ONNX export of layer networks: every layer kind maps to standard ONNX nodes that ONNX Runtime's CPU
provider runs exactly, or is declined with an OnnxExportError that names the layer, kind and param."""
from torchkiln.onnx_export.context import OnnxExportError
from torchkiln.onnx_export.export import DEFAULT_OPSET, network_to_onnx, supports

__all__ = ["DEFAULT_OPSET", "OnnxExportError", "network_to_onnx", "supports"]
