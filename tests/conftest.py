import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the harness module

import harness  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--backend", choices=["auto", "reference", "onnxruntime"], default=None,
                     help="the backend harness.check_compiled compiles for where a test names none "
                          "(default: compile's own, auto: onnxruntime on the CPU)")


def pytest_configure(config):
    harness.DEFAULT_BACKEND = config.getoption("backend")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def triton_interpreter(tmp_path_factory):
    """Triton's CPU interpreter where there is no GPU (read when a kernel module is loaded); generated kernel files
    in a temporary cache folder. Modules of generated-kernel tests use it through `pytestmark`."""
    from torchkiln.runtime.backends.cuda.cache import CACHE_ENV

    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "1")
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("torchkiln-cache")))
        yield
