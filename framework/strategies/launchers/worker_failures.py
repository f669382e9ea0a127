"""How a worker's failure reaches the person who started the job: once.

A worker under an elastic agent (fw's launcher or torchrun) writes its exception and traceback to
the file the agent names (``TORCHELASTIC_ERROR_FILE``), with the time to the microsecond. Under
fw's launcher the worker then prints nothing of it itself, and the launcher prints the first
failure's traceback once, under its rank, then one line for each other rank that failed (its
exception's last line), and exits with the first failure's code. A user's mistake (an ``FwError``:
a refusal at set-up, most often raised alike on every rank) has no traceback to show: the
launcher prints its one line ``fw: error: ...`` once, as ``fw`` does in one process, and names
the rank only when other ranks failed otherwise. Under torchrun workers print their own
tracebacks, as torchrun users expect, and a refusal every rank raises alike from the configuration
(``FwError.alike_on_every_rank``) is printed by rank 0 alone, as under mpirun.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from framework.errors import FwError
from framework.rank_zero import global_rank
from framework.strategies.launchers.failure_stamp import FailureStamp, earliest_first
from framework.strategies.launchers.processes import LAUNCHER_PID

_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
QUIET_RANK_GRACE_S = 10.0  # long enough for torchrun to stop this rank after rank 0 ends, on a loaded machine


#: (id, text) of the exception this process wrote into the error file: a later one that does not
#: follow from it (the user caught it, then something else failed) replaces it
_written: list[tuple[int, str]] = []


def record_worker_error(exc: BaseException) -> None:
    """Under an elastic agent, write this worker's error where the agent reads it (the format of
    torch's ``ErrorHandler.record_exception``, which torchrun's ``@record`` uses), at the time it
    is raised: the first exception is the one that failed the worker, and what follows from it
    (raised while handling it, or from it) keeps its time. An exception the user caught does not
    stay there: the one that ends the program, if another, replaces it."""
    path = os.environ.get(_ERROR_FILE)
    if not path or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    if os.path.exists(path) and (not _written or _follows_from(exc, _written[0])):
        return
    stamp = FailureStamp.of(exc)
    extra: dict[str, Any] = {"py_callstack": stamp.traceback, "timestamp": str(int(stamp.time)), "fw_time": stamp.time}
    if isinstance(exc, FwError):  # the user's to fix: the launcher prints the message, not the traceback
        extra["fw_error"] = str(exc)
    data = {"message": {"message": _text(exc), "extraInfo": extra}}
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError:
        return
    _written[:] = [(id(exc), _text(exc))]


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _follows_from(exc: BaseException, written: tuple[int, str]) -> bool:
    """``exc`` is the written exception, or was raised while handling it or from it."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if (id(link), _text(link)) == written:
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def leave_tracebacks_to_the_launcher() -> None:
    """In a worker of fw's launcher: an exception that ends the program is recorded for the
    launcher, which prints it; Python's own print of it would repeat it once per rank."""
    if getattr(sys.excepthook, "fw_launcher", False):
        return
    default = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            record_worker_error(exc)
            if os.path.exists(os.environ.get(_ERROR_FILE, "")) and _last_attempt():
                return
        default(kind, exc, tb)  # also when the agent will restart the workers: it reports nothing then

    hook.fw_launcher = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def launcher_reports(err: FwError) -> bool:
    """In a worker of fw's launcher, with ``err`` ending the program: record it for the launcher
    and say whether the launcher prints it (this worker then prints nothing: the same line from
    every rank would repeat it)."""
    if not os.environ.get(LAUNCHER_PID):
        return False
    record_worker_error(err)
    return os.path.exists(os.environ.get(_ERROR_FILE, "")) and _last_attempt()


def said_by_another_process(err: FwError) -> bool:
    """Whether another process prints ``err``, which ends this one, for the job: fw's launcher
    (``launcher_reports``), or, under torchrun or mpirun, rank 0, where every rank raises ``err``
    alike (``FwError.alike_on_every_rank``: the configuration's; a rank's own error is its own to say).
    Under torchrun such a rank waits ``QUIET_RANK_GRACE_S``: torchrun stops it when rank 0 ends
    with the line; still running after the wait, it says the line itself (rank 0 did not raise it).
    mpiexec and srun stop no rank when another ends: there it exits at once, and rank 0 says it.
    """
    if os.environ.get(LAUNCHER_PID):
        return launcher_reports(err)
    if not err.alike_on_every_rank or global_rank() == 0:
        return False
    if not os.environ.get("TORCHELASTIC_RUN_ID"):  # mpiexec, srun: nothing stops this rank when rank 0 ends
        return True
    time.sleep(QUIET_RANK_GRACE_S)  # torchrun stops this rank when rank 0 ends with the same line...
    return False  # ...unless rank 0 did not raise it: say it here


def _last_attempt() -> bool:
    """No restart left (``max_restarts``): this failure ends the job, and the launcher reports it."""
    env = os.environ
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) >= int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))


def report_failures(failures: dict[int, Any]) -> int:
    """The launcher's report of the workers that failed (``ChildFailedError.failures``): the
    first one's traceback, one line per other; the exit code to end with."""
    ordered = earliest_first(failures.items(), lambda item: _failed_at(item[1]))
    rank, first = ordered[0]
    code = first.exitcode if isinstance(first.exitcode, int) and first.exitcode > 0 else 1
    refusal = _extra(first).get("fw_error")
    if refusal is not None:
        return _report_refusal(refusal, ordered)
    callstack = _extra(first).get("py_callstack", "")
    others = f"; {len(ordered) - 1} other rank(s) failed too" if len(ordered) > 1 else ""
    lines = [f"fw: error: worker rank {rank} (pid {first.pid}) failed with exit code {first.exitcode}: "
             f"{_summary(first)}{others}; the other workers were stopped"]
    if callstack:
        lines.append(f"rank {rank}'s traceback:\n{callstack.rstrip()}")
    for other_rank, other in ordered[1:]:
        lines.append(f"fw: worker rank {other_rank} (pid {other.pid}) also failed: {_summary(other)}")
    sys.stderr.write("\n".join(lines) + "\n")
    return code


def _report_refusal(refusal: str, ordered: list[tuple[int, Any]]) -> int:
    """The first failure was a user's mistake (``FwError``): its line once when every rank that
    failed failed with it, else with its rank and a line per other; no traceback. The exit code
    is the first that a worker exited with (one that recorded the error may have been stopped by
    the agent's SIGTERM before it could exit on its own)."""
    exited = [f.exitcode for _, f in ordered if isinstance(f.exitcode, int) and f.exitcode > 0]
    if all(_extra(other).get("fw_error") == refusal for _, other in ordered):
        sys.stderr.write(f"fw: error: {refusal}\n")
    else:
        lines = [f"fw: error: worker rank {ordered[0][0]}: {refusal}"]
        lines += [f"fw: worker rank {r} (pid {other.pid}) also failed: {_summary(other)}" for r, other in ordered[1:]]
        sys.stderr.write("\n".join(lines) + "\n")
    return exited[0] if exited else 1


def _extra(failure: Any) -> dict:
    message = failure.message
    return message.get("extraInfo", {}) if isinstance(message, dict) else {}


def _summary(failure: Any) -> str:
    message = failure.message
    text = message.get("message", "") if isinstance(message, dict) else message
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {failure.exitcode}"


def _failed_at(failure: Any) -> float:
    exact = _extra(failure).get("fw_time")
    return float(exact) if exact is not None else float(failure.timestamp)
