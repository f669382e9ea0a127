"""A Sphinx extension: napoleon leaves the docstrings of attributes, properties and module data as
written.

napoleon reads an attribute's docstring in Google style, ``type: description``, so fw's prose
(``#: Detection order: the first whose detect is true wins``, a property's ``Lightning's name of
the run's precision: ...``) came out as a description with a made-up "Type: Detection order". fw
writes the types of these as annotations, which autodoc shows in the signature; only functions and
classes have ``Args:``/``Raises:`` sections for napoleon to read."""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx

PLAIN = ("attribute", "data", "property")
_written: dict[str, list[str]] = {}


def keep(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Before napoleon (priority 400 < its 500): remember the lines as written."""
    if what in PLAIN:
        _written[name] = list(lines)


def restore(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """After napoleon (priority 600): put them back."""
    if what in PLAIN and name in _written:
        lines[:] = _written.pop(name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.napoleon")
    app.connect("autodoc-process-docstring", keep, priority=400)
    app.connect("autodoc-process-docstring", restore, priority=600)
    return {"version": "1", "parallel_read_safe": True}
