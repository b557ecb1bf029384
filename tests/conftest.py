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
