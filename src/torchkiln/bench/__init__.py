"""`python -m torchkiln bench`: torchkiln against its peers on the model zoo (`compare.py`, its chart `chart.py`),
and trtexec-style latency and profile of one saved module (`saved.py`). Sits on top of the package, like cli.py."""
from torchkiln.bench.compare import run_comparison
from torchkiln.bench.saved import BenchInputError, run_saved

__all__ = ["BenchInputError", "run_comparison", "run_saved"]
