import os
from pathlib import Path

import pytest

from hetplan.instance import load_instance

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    return Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared"))


@pytest.fixture
def a100_v100():
    return load_instance(REPO / "instances" / "a100_v100_one_zone.yaml")
