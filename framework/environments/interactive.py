"""Is this an interactive session: a Jupyter/IPython kernel, an interactive interpreter,
``python -c`` or ``python -``? There is no program file to re-run there, so fw's launcher (which
re-runs the program in each worker) cannot start workers, and ``ddp_notebook`` (workers forked
from this process) is what works, as Lightning picks it for such sessions.
"""

from __future__ import annotations

import os
import sys


def interactive_session() -> str | None:
    """What kind of interactive session this is (for a message), or None for a program run from
    a file (``python script.py``, ``python -m pkg``, a console script)."""
    if "ipykernel" in sys.modules and _in_ipython_kernel():
        return "a Jupyter kernel"
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return "an interactive session"
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return None  # python -m pkg: the module can be run again
    first = sys.argv[0] if sys.argv else ""
    if first in ("-c", ""):
        return "python -c"
    if first == "-":
        return "python - (a program read from stdin)"
    if not os.path.isfile(first) and not getattr(__main__, "__file__", None):
        return "a session without a program file"
    return None


def _in_ipython_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
