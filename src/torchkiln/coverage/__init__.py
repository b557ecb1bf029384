"""Op coverage against a list of TorchScript op names (by default the bundled ts_ops_floor.txt)."""
from torchkiln.coverage.floor import OpCoverage, floor_coverage, format_report, read_floor

__all__ = ["OpCoverage", "floor_coverage", "format_report", "read_floor"]
