"""Op coverage against a list of TorchScript op names (by default the bundled ts_ops_floor.txt)."""
from torchkiln.coverage.floor import OpCoverage, floor_coverage, format_report, read_floor
from torchkiln.coverage.overloads import (OverloadCoverage, floor_overloads, format_overload_report,
                                          overload_coverage, read_seen)

__all__ = ["OpCoverage", "OverloadCoverage", "floor_coverage", "floor_overloads", "format_overload_report",
           "format_report", "overload_coverage", "read_floor", "read_seen"]
