"""pytest setup for the llmkern Python tests: makes the package importable from a checkout
(python/ of the repository when it is neither on PYTHONPATH nor installed) and provides
the rng fixture. Helpers live in helpers.py."""
import os
import sys

import numpy as np
import pytest

try:
    import llmkern  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import llmkern  # noqa: F401


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
