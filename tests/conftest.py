import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def repo() -> Path:
    return REPO
