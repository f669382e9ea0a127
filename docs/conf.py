"""Sphinx configuration of fw's documentation site (``sphinx-build -W -b html docs docs/_build/html``).

Pages are Markdown (MyST); the API reference is generated from the docstrings (autodoc); the theme
is Furo, which fetches nothing at view time (system fonts, its own CSS and JavaScript), so the
built folder opens from disk. ``_ext/public_names.py`` fails the build when a public name is
missing from the API reference; ``_ext/accepted_types.py`` shows what an argument annotated ``Any``
accepts.

Why Sphinx (with MyST for Markdown) and not MkDocs: autodoc imports the real package, so the
reference is the code's own docstrings and signatures; ``-W`` turns every broken link, bad
cross-reference and docstring error into a failed build; it is the generator PyTorch's and
Lightning's own docs use, so their users meet the layout they know; and it is released
regularly (the newest MkDocs on PyPI on 2026-12-07 was 1.6.1, of 2024)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's framework/, also without an install
sys.path.insert(0, str(HERE / "_ext"))

project = "fw"
author = "fw's developers"
copyright = "2026, fw's developers"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "attribute_docs", "public_names",
              "accepted_types"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_heading_anchors = 3  # `page.md#a-heading` links work as on GitHub
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
# Types go in the signature, one parameter a line once it is long (the Trainer has 45): the docstrings'
# ``Args:`` name several related arguments in one entry (``max_epochs, min_epochs, ...: when to stop``),
# which napoleon keeps as one entry without ``napoleon_use_param``, and which a types-in-the-description
# list would repeat once per name.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True}  # no "Bases:" line: show-inheritance is off
# a subclass lists what it documents itself; an override without a docstring is its base's, documented there
autodoc_inherit_docstrings = False
python_maximum_signature_line_length = 100
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_param = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = "fw"
html_static_path: list[str] = []
html_show_sourcelink = False
# No text snippets under the search results: Sphinx fetches each result page for its snippet, which a
# browser refuses for a page opened from disk (file://, CORS), logging an error per result; without
# them, search works the same from disk as from a server (the results are the pages' titles).
html_show_search_summary = False
html_copy_source = False
