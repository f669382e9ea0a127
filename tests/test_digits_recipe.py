"""The digits recipe's data (``recipes/digits.py``): ``fw test`` scores images that neither
trained the model nor picked its best checkpoint (its validation set did both before)."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from recipes.digits import DigitsData


def test_the_test_split_is_held_out_from_training_and_validation():
    data = DigitsData()
    data.setup("fit")
    rows = {name: {tuple(x.tolist()) for x, _ in getattr(data, f"{name}_dataloader")().dataset}
            for name in ("train", "val", "test")}
    assert len(rows["test"]) >= 150 and len(rows["val"]) >= 300
    assert not rows["test"] & rows["val"] and not rows["test"] & rows["train"] and not rows["val"] & rows["train"]
