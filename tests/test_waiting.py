"""``framework/waiting.py``: what a timed-out collective was waiting in is the innermost mark the
error left, and a later error names its own marks, not an earlier one's that was caught."""

from __future__ import annotations

import pytest

from framework import waiting
from framework.waiting import waiting_in


def test_an_error_names_the_marks_it_left_and_a_later_one_its_own():
    with waiting_in("a checkpoint save of 'x.ckpt'"), waiting_in("an all-gather"):
        assert waiting.now() == "a checkpoint save of 'x.ckpt': an all-gather"
    assert waiting.now() is None
    try:  # caught, and the run goes on (a callback that tries a save)
        with waiting_in("a checkpoint save of 'x.ckpt'"), waiting_in("an all-gather"):
            raise RuntimeError("disk full")
    except RuntimeError:
        pass
    assert waiting.failed_in() == "a checkpoint save of 'x.ckpt': an all-gather"
    with pytest.raises(RuntimeError), waiting_in("the backward pass's gradient sync"):  # as deep as its one mark
        raise RuntimeError("Timed out waiting 5000ms")
    assert waiting.failed_in() == "the backward pass's gradient sync"
    with pytest.raises(RuntimeError, match="in the step itself"), waiting_in("training_step"):
        _fails_after_an_inner_mark_closed()
    assert waiting.failed_in() == "training_step" and waiting.now() is None


def _fails_after_an_inner_mark_closed() -> None:
    """An error in ``training_step`` after an inner mark (an all-reduce) closed."""
    with waiting_in("an all-reduce"):
        pass
    raise RuntimeError("in the step itself")
