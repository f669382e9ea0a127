"""Checking and normalising the Trainer's arguments; each mistake is a ConfigError that names
the ``trainer.<key>`` and says what to write instead. (The arguments themselves are listed once,
in ``Trainer.__init__``; the recipe schema is derived from that signature.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from framework.accelerators import Accelerator
    from framework.environments import ClusterEnvironment


def as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"trainer.{name}={value!r}: must be an integer >= 1")
    return value


def default_strategy(strategy: Any, devices: int, num_nodes: int, environment: ClusterEnvironment) -> Any:
    """What ``strategy="auto"`` is: one device ``single``, more ``ddp``, and in an interactive
    session (a notebook, ``python -c``: no program fw's launcher could re-run) on one node
    ``ddp_notebook``, as Lightning picks it there."""
    is_auto = strategy in (None, "auto") or (isinstance(strategy, dict) and strategy.get("name") == "auto")
    if not is_auto:
        return strategy
    # a launcher's job of several processes is data parallel even where each node holds one (Ray may)
    launched = environment.info().world_size if environment.launched_externally else 1
    auto = "ddp" if devices * num_nodes > 1 or launched > 1 else "single"
    if auto == "ddp" and num_nodes == 1 and not environment.launched_externally:
        from framework.environments.interactive import interactive_session

        session = interactive_session()
        if session:
            from framework.rank_zero import rank_zero_info

            auto = "ddp_notebook"
            rank_zero_info(f"fw: strategy=auto with devices={devices} in {session}: using ddp_notebook (workers "
                           "forked from this process)")
    return {**strategy, "name": auto} if isinstance(strategy, dict) else auto


def devices_for(devices: Any, environment: ClusterEnvironment, accelerator: Accelerator) -> Any:
    """Under torchrun/srun/mpiexec on CPU, ``devices=auto`` means one device per launched task."""
    if devices == "auto" and accelerator.name == "cpu" and environment.launched_externally:
        return environment.info().local_world_size
    return devices


def one_of(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"trainer.{name}={value!r}: use one of {', '.join(choices)}{did_you_mean(value, choices)}")
    return value


def signal_arg(name: str, value: Any) -> str | None:
    import signal

    if value is None:
        return None
    text = str(value).upper()
    text = text if text.startswith("SIG") else f"SIG{text}"
    if not isinstance(getattr(signal, text, None), signal.Signals):
        raise ConfigError(f"trainer.{name}={value!r}: not a signal name; use e.g. SIGUSR1, SIGUSR2, or null")
    return text


def clip_algorithm(value: str | None) -> str | None:
    """``norm``, ``value``, or None (Lightning's default: norm, unless ``clip_gradients`` says)."""
    if value is None:
        return None
    value = str(value).lower()
    if value not in ("norm", "value"):
        raise ConfigError(f"trainer.gradient_clip_algorithm '{value}': use norm or value")
    return value


def parse_devices(devices: Any, accelerator: Accelerator) -> list[int]:
    """Local device indices this node uses, with Lightning's meanings: a count ``n`` (``"n"``),
    a list of GPU indices, ``"auto"`` (every visible GPU on CUDA, one process on the CPU), and
    ``-1`` (``"-1"``): every visible GPU. On the CPU ``-1`` is an error, as in Lightning: there is
    no device count to take all of, and one process would run where the user asked for many.

    Raises:
        ConfigError: ``devices`` is 0, negative, -1 on the CPU, a list with repeated or missing
            GPUs, or not a count, a list or ``"auto"``.
    """
    available = accelerator.device_count()
    if isinstance(devices, str):
        devices = devices.strip()
        devices = int(devices) if devices.isdigit() or devices == "-1" else devices
    if devices == "auto":
        return list(range(available)) if accelerator.name == "cuda" else [0]
    if type(devices) is int and devices == -1:
        if accelerator.name != "cuda":
            raise ConfigError(
                f"trainer.devices=-1 means every GPU, and trainer.accelerator={accelerator.name} has none: set "
                "trainer.devices to the number of processes (e.g. 1 or 2), or trainer.accelerator=cuda on a GPU machine"
            )
        if available < 1:
            raise ConfigError("trainer.devices=-1: no GPU is visible (torch.cuda.device_count() is 0; check "
                              "CUDA_VISIBLE_DEVICES); set trainer.accelerator=cpu")
        return list(range(available))  # all visible ones: CUDA_VISIBLE_DEVICES already masked the rest
    if type(devices) is int:
        if devices < 1:
            raise ConfigError(f"trainer.devices={devices}: use a count >= 1 or 'auto'"
                              + (" (or -1: every GPU)" if accelerator.name == "cuda" else ""))
        indices = list(range(devices))
    elif isinstance(devices, (list, tuple)) and devices and all(type(d) is int and d >= 0 for d in devices):
        indices = list(devices)
        if len(set(indices)) != len(indices):
            raise ConfigError(f"trainer.devices={list(devices)}: a device is listed twice; list each once")
    else:
        raise ConfigError(f"trainer.devices={devices!r}: use a count (2), a list of GPU indices ([0, 1]) or 'auto'")
    if accelerator.name == "cuda" and max(indices) >= available:
        raise ConfigError(
            f"trainer.devices={devices}: this machine has {available} GPU(s); "
            f"set trainer.devices to at most {available}"
        )
    return indices


def limit_arg(name: str, value: Any) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"trainer.{name}={value!r}: use a number of batches (int) or a fraction (0.0-1.0)")
    if isinstance(value, float) and value > 1.0:
        raise ConfigError(f"trainer.{name}={value}: a float is a fraction and must be <= 1.0")
    return value


def parse_max_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) == 4 and all(p.isdigit() for p in parts):
            d, h, m, s = map(int, parts)
            return float(((d * 24 + h) * 60 + m) * 60 + s)
    if isinstance(value, dict):
        units = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
        if set(value) <= set(units):
            return float(sum(units[k] * v for k, v in value.items()))
    raise ConfigError(f"trainer.max_time={value!r}: use seconds, 'DD:HH:MM:SS' or {{days, hours, minutes, seconds}}")


def check_val_check_interval(value: Any, check_val_every_n_epoch: Any = 1) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, float) and check_val_every_n_epoch is None:  # as Lightning refuses it
        raise ConfigError(f"trainer.val_check_interval={value!r}: a fraction of an epoch needs epochs; with "
                          "check_val_every_n_epoch=None give a number of training batches (int >= 1)")
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError(
        f"trainer.val_check_interval={value!r}: use a number of training batches (int >= 1) "
        "or a fraction of an epoch (float in (0, 1])"
    )


def check_callbacks(callbacks: list) -> list:
    from framework.callbacks.base import Callback

    for i, cb in enumerate(callbacks):
        if not isinstance(cb, Callback):
            hint = " (a mapping without '_target_'?)" if isinstance(cb, dict) else ""
            raise ConfigError(f"callbacks[{i}]: {type(cb).__name__} is not an fw Callback{hint}")
    return callbacks


def fast_dev_run_arg(value: Any) -> int:
    """``fast_dev_run``: False/0 off, True 1 batch, n batches."""
    if value is True:
        return 1
    if value is False or value is None:
        return 0
    if isinstance(value, int) and value >= 0:
        return value
    raise ConfigError(f"trainer.fast_dev_run={value!r}: use true (1 batch), false, or a number of batches >= 0")


def non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"trainer.{name}={value!r}: use a whole number >= 0")
    return value
