"""Errors that fw raises for user mistakes.

The CLI prints an ``FwError`` as one line (``fw: error: ...``) with no traceback and exits
with ``exit_code``; anything else (an error in user code) keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class FwError(Exception):
    """Base of every error that is the user's to fix; the message says how."""

    exit_code = 1
    #: raised from the configuration alone (the recipe, the Trainer's arguments, the strategy's
    #: settings, the model they build), before any rank-specific data, file or device is seen: every
    #: rank of a job raises it alike, so rank 0 alone prints it (``raised_alike_on_every_rank``)
    alike_on_every_rank = False


@contextmanager
def raised_alike_on_every_rank() -> Iterator[None]:
    """Mark an ``FwError`` raised inside (a block, or a function it decorates) as one that every rank
    raises alike: a check of the configuration alone, never of data, files or devices."""
    try:
        yield
    except FwError as err:
        err.alike_on_every_rank = True
        raise


class ConfigError(FwError):
    """A recipe, an override or a Trainer argument is wrong."""

    exit_code = 2


class DistributedSetupError(FwError):
    """The distributed job cannot be set up (launcher, rendezvous, interface, backend)."""

    exit_code = 1


class CheckpointError(FwError):
    """A checkpoint cannot be read, or does not fit this run (another model; a mid-epoch position
    on another number of ranks); the file is left as it is."""

    exit_code = 1


class TrainingError(FwError):
    """Training went wrong in a way fw refuses to continue from (a non-finite loss, nothing
    trained); what was saved before stays as it is."""

    exit_code = 1


def did_you_mean(name: str, known: Iterable[object]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest of ``known``, or ``""``."""
    import difflib

    names = [str(k) for k in known]
    by_lower = {n.lower(): n for n in reversed(names)}  # CsvLogger -> CSVLogger, not Logger
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""


class ProgramEnds(SystemExit):  # a SystemExit: the program ends with its code
    """fw ends the program from inside a call, with ``code`` as its exit status: the process only
    launched the workers (``JobEnded``), or a fit stopped on a signal with its checkpoint
    written (``StoppedBySignal``). ``fw``'s entry point returns the code; under a user's script
    it ends the program as an uncaught ``SystemExit`` does (``finally`` blocks run, the code
    after the call does not)."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def require_package(module: str, who: str, install: str) -> None:
    """Refuse ``who`` (a logger, an export, a callback) without the optional package ``module``
    (found, not imported), saying how to ``install`` it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"{who} needs the {module} package, which is not installed: {install}", name=module)


def install_command(extra: str) -> str:
    """How to add an extra to this fw: from its clone when it runs from one (``pip install -e``
    of a checkout), else from the package index."""
    from pathlib import Path

    clone = Path(__file__).resolve().parents[1]
    if (clone / "pyproject.toml").is_file() and (clone / "framework").is_dir():
        where = "." if clone == Path.cwd().resolve() else str(clone)
        return f"pip install -e '{where}[{extra}]'"
    return f"pip install 'fw[{extra}]'"
