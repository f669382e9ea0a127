"""The code blocks of README.md and docs/**/*.md, and how each is tested (our own small collector:
the pages are MyST Markdown, whose ``{directive}`` fences are Sphinx's, not code).

Every fenced block has a language. ``python`` and ``bash`` blocks run, in the order of their page,
in one fresh folder per page that holds a copy of the repository's ``conf/``: a ``python`` block as
a script (``python block.py``), a ``bash`` block with ``bash -e``, ``fw`` on the PATH; each must
exit 0. ``text`` blocks are output or plain text and never run. A block of any other language
(``yaml``, ``ini``, ...) is a file the page writes or a fragment, and says which.

HTML comments on the lines just above a fence mark it:

- ``<!-- fragment: why -->``: shown for reading, not run (part of a class, a cluster's command);
- ``<!-- file: path -->``: written to ``path`` in the page's folder, for the blocks after it;
- ``<!-- expect: words -->``: the block's output (stdout and stderr) holds these words; repeatable;
- ``<!-- timeout: 180 -->``: seconds the block may take (default 120, times the suite's time scale).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = {"python", "bash"}
NEVER_RUN = {"text"}
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARK = re.compile(r"^\s*<!--\s*(?P<kind>fragment|file|expect|timeout)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
MARK_LIKE = re.compile(r"^\s*<!--\s*(?P<kind>[a-z-]+)\s*:")


@dataclass
class Block:
    page: Path
    line: int  #: 1-based line of the opening fence
    language: str
    body: str
    fragment: str | None = None
    file: str | None = None
    expect: list[str] = field(default_factory=list)
    timeout: float = 120.0

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.fragment is None and self.file is None and self.language in RUN


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    """The page's code blocks, with their marks; a ValueError names a block that breaks the rules above."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, info = opened["fence"], opened["info"].strip()
        end = next((j for j in range(i + 1, len(lines))
                    if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(fence[0])),
                   None)
        if end is None:
            raise ValueError(f"{page.relative_to(ROOT)}:{i + 1}: a code fence that never closes")
        if not info.startswith("{"):  # a MyST directive ({toctree}, {autoclass}, ...) is not code
            found.append(_block(page, lines, i, end, info))
        i = end + 1
    return found


def _block(page: Path, lines: list[str], start: int, end: int, info: str) -> Block:
    where = f"{page.relative_to(ROOT)}:{start + 1}"
    language = info.split()[0] if info else ""
    if not language:
        raise ValueError(f"{where}: a code block without a language (```python, ```bash, ```yaml, ```text)")
    block = Block(page, start + 1, language, "\n".join(lines[start + 1:end]) + "\n")
    j = start - 1
    while j >= 0 and lines[j].strip().startswith("<!--"):
        mark = MARK.match(lines[j])
        if not mark:
            if MARK_LIKE.match(lines[j]):
                raise ValueError(f"{where}: {lines[j].strip()!r} is no mark (fragment, file, expect, timeout)")
            break
        kind, arg = mark["kind"], (mark["arg"] or "")
        if kind == "fragment":
            block.fragment = arg or "a fragment"
        elif kind == "file":
            if not arg:
                raise ValueError(f"{where}: <!-- file: --> needs a path")
            block.file = arg
        elif kind == "expect":
            block.expect.append(arg)
        else:
            block.timeout = float(arg)
        j -= 1
    if block.language not in RUN | NEVER_RUN and block.fragment is None and block.file is None:
        raise ValueError(f"{where}: a ```{block.language} block is neither run nor marked: put "
                         "<!-- file: path --> or <!-- fragment: why --> on the line above it")
    if block.language in NEVER_RUN and (block.file or block.expect):
        raise ValueError(f"{where}: a ```text block is never run; its marks would say otherwise")
    return block
