"""The W&B server an online WandbLogger run talks to: looked at before the run starts, so that a
server that is not there is one line (the URL and the fix) instead of ``wandb.init``'s traceback
after about 2 minutes; and the bounded wait for it at the end of the run.

Mid-run, wandb's own service process keeps what the run logs and retries the server by itself:
training goes on while the server is away. At the end, ``run.finish`` would wait for every upload
without limit (wandb's ``finish_timeout`` is 0: no limit); here it waits ``flush_timeout`` seconds,
then one warning names the server and the run folder that ``wandb sync`` uploads from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from framework.errors import ConfigError
from framework.loggers.mlflow_store import why_not_answering
from framework.rank_zero import rank_zero_warn

NOT_ONLINE = ("offline", "dryrun", "disabled")


def _given(settings: Any, name: str) -> Any:
    """Field ``name`` of the ``settings=`` given to the logger (a mapping or a ``wandb.Settings``),
    only where it was set."""
    if isinstance(settings, Mapping):
        return settings.get(name)
    if settings is not None and name in getattr(settings, "model_fields_set", ()):
        return getattr(settings, name)
    return None


def server_url(init_kwargs: Mapping[str, Any]) -> str | None:
    """The server URL of the run ``wandb.init(**init_kwargs)`` would start, ``None`` when it would
    not be online. What wandb itself resolves (``WANDB_BASE_URL``, ``WANDB_MODE``, its settings
    files), without starting its service; the logger's own arguments first."""
    from wandb.sdk import wandb_setup

    resolved = wandb_setup.singleton().settings
    given = init_kwargs.get("settings")
    mode = init_kwargs.get("mode") or _given(given, "mode") or resolved.mode
    if mode in NOT_ONLINE:
        return None
    return str(_given(given, "base_url") or resolved.base_url)


def check_server(url: str) -> None:
    """Refuse, in one line, a W&B server that does not answer now."""
    why = why_not_answering(url)
    if why is not None:
        raise ConfigError(f"WandbLogger: no W&B server answers at {url} ({why}); start one or point WANDB_BASE_URL at "
                          "one that runs, or log offline (WANDB_MODE=offline, or WandbLogger(offline=True)) and "
                          "upload the run later with `wandb sync`")


def with_finish_timeout(settings: Any, seconds: float) -> Any:
    """``settings=`` for ``wandb.init``: the user's, with ``finish_timeout`` (raising) unless they set one."""
    ours = {"finish_timeout": float(seconds), "finish_timeout_raises": True}
    if settings is None:
        return ours
    if isinstance(settings, Mapping):
        return {**ours, **settings}
    return settings.model_copy(update={k: v for k, v in ours.items() if k not in settings.model_fields_set})


def finish(run: Any, exit_code: int, url: str | None, seconds: float) -> None:
    """``run.finish``, waiting at most ``seconds`` for the server; one warning when it did not take
    everything by then (the run's data stays in its folder for ``wandb sync``)."""
    folder = getattr(run.settings, "sync_dir", None)
    try:
        run.finish(exit_code=exit_code)
    except TimeoutError:
        why = why_not_answering(url) if url else None
        rank_zero_warn(f"WandbLogger: the W&B server at {url} did not take all of run {run.id}'s data in {seconds:g} s"
                       f" ({why or 'still uploading'}); what was not uploaded (history, summary, files) is kept in "
                       f"{folder}: `wandb sync {folder}` uploads it when the server is back")


def netrc_host() -> str:
    """The host of ``wandb login``'s netrc entry: ``WANDB_BASE_URL``'s, else wandb's default server."""
    from urllib.parse import urlparse

    from wandb.sdk.lib.urls import DEFAULT_BASE_URL

    return urlparse(os.environ.get("WANDB_BASE_URL", DEFAULT_BASE_URL)).hostname or ""
