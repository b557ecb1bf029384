import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the harness module


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
