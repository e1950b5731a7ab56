import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def repo() -> Path:
    return REPO


def pytest_collection_modifyitems(items):
    """Tests marked ``timing`` run first: the 8-process tests leave the 1-minute load average
    high for a minute after they end, which timing comparisons would otherwise wait out."""
    items.sort(key=lambda item: item.get_closest_marker("timing") is None)  # stable sort
