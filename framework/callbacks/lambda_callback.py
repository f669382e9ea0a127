"""``LambdaCallback``: a callback made of functions, one per hook, as Lightning's.

``LambdaCallback(on_train_epoch_end=lambda trainer, module: ...)``: each function is set on the
instance under its hook's name and called as the hook is, without ``self``. Lightning's hook
names only; a misspelt one is refused with the nearest name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from framework.callbacks.base import Callback
from framework.errors import ConfigError, did_you_mean

#: the hooks Lightning's LambdaCallback takes
HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
    "on_train_start", "on_train_end", "on_validation_start", "on_validation_end", "on_test_start", "on_test_end",
    "on_exception", "on_save_checkpoint", "on_load_checkpoint", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_predict_start", "on_predict_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_predict_epoch_start", "on_predict_epoch_end",
)


class LambdaCallback(Callback):
    """A callback whose hooks are the functions given by name (None: the hook does nothing)."""

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        for name, fn in hooks.items():
            if name not in HOOKS:
                raise ConfigError(f"LambdaCallback({name}=...): no such hook{did_you_mean(name, HOOKS)}")
            if fn is not None:
                setattr(self, name, fn)
