"""Expand SLURM hostlists such as ``node[01-04,07],gpu-a[1-2]b[3-4]`` into host names.

SLURM writes node sets compactly (``SLURM_NODELIST``, ``SLURM_STEP_NODELIST``). The rules
followed here are those of Slurm's ``hostlist.c``:

- commas outside brackets separate host expressions; commas inside separate ranges;
- a range ``lo-hi`` keeps the zero padding of ``lo``: ``n[001-003]`` gives ``n001``..``n003``,
  ``n[8-10]`` gives ``n8 n9 n10``;
- several bracket groups in one expression form a cartesian product, the first group varying
  slowest: ``a[1-2]b[3-4]`` gives ``a1b3 a1b4 a2b3 a2b4``;
- duplicates are kept and order is preserved.

``expand_hostlist`` asks ``scontrol show hostnames`` when it is installed (the authority on
whatever syntax the local Slurm accepts) and falls back to ``parse_hostlist`` otherwise.
"""

from __future__ import annotations

import re
import shutil
import subprocess

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> list[str]:
    """Return the host names of a SLURM hostlist, in SLURM order.

    The pure parser runs first, to reject malformed input (``scontrol`` prints garbage such
    as ``n]`` for ``n[1-2`` and exits 0). Then ``scontrol show hostnames`` (5 s timeout) has
    the final word when installed and able to expand it; otherwise the parser's answer stands
    (Slurm 22.05 rejects a plain suffix such as ``n[1-2]-ib``, which the parser accepts).

    Raises:
        ValueError: the hostlist is malformed.
    """
    parsed = parse_hostlist(hostlist)
    scontrol = shutil.which("scontrol")
    if scontrol and parsed:
        try:
            done = subprocess.run(
                [scontrol, "show", "hostnames", hostlist],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            done = None
        # scontrol reports an invalid list on stderr, with exit status 0 and no output.
        if done is not None and done.returncode == 0 and done.stdout.split():
            return done.stdout.split()
    return parsed


def parse_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM hostlist in pure Python (no ``scontrol``).

    Raises:
        ValueError: unbalanced or nested brackets, an empty or reversed range, or a
            non-numeric range bound.
    """
    hosts: list[str] = []
    for expression in _split_top_level(hostlist):
        hosts.extend(_expand_expression(expression, hostlist))
    return hosts


def _split_top_level(hostlist: str) -> list[str]:
    """Split at commas and whitespace that are outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in hostlist {hostlist!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {hostlist!r}")
        if depth == 0 and (char == "," or char.isspace()):
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {hostlist!r}")
    parts.append("".join(current))
    return [part for part in parts if part]


def _expand_expression(expression: str, hostlist: str) -> list[str]:
    """Expand one host expression such as ``a[1-2]b[3-4]c`` (no top-level commas)."""
    start = expression.find("[")
    if start < 0:
        return [expression]
    end = expression.index("]", start)  # balanced: checked by _split_top_level
    prefix, body, rest = expression[:start], expression[start + 1 : end], expression[end + 1 :]
    suffixes = _expand_expression(rest, hostlist) if rest else [""]
    return [prefix + number + suffix for number in _expand_ranges(body, hostlist)
            for suffix in suffixes]


def _expand_ranges(body: str, hostlist: str) -> list[str]:
    """Expand the inside of one bracket: ``01-04,07`` gives ``01 02 03 04 07``."""
    numbers: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ValueError(f"bad range {item!r} in hostlist {hostlist!r}")
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            raise ValueError(f"reversed range {item!r} in hostlist {hostlist!r}")
        width = len(lo_text)
        numbers.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return numbers
