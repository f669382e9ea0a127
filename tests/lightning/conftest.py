from __future__ import annotations

import os

import pytest

#: what ``pytorch_lightning.seed_everything`` leaves in the environment for its worker processes
LIGHTNING_SEED_VARIABLES = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@pytest.fixture(autouse=True)
def _lightning_seed_stays_in_the_test():
    """Lightning's ``seed_everything`` sets process-wide variables by design; a comparison with
    Lightning must not hand them to the next test (the leak guard would fail it)."""
    before = {key: os.environ.get(key) for key in LIGHTNING_SEED_VARIABLES}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
