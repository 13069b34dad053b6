"""Sphinx configuration: Markdown pages (MyST) and an API reference from the docstrings.

Build strictly from the repository root:

    python3 -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The checkout's package, also where fuseops is not installed.
sys.path.insert(0, str(ROOT))

import fuseops  # noqa: E402

project = "fuseops"
author = "the fuseops authors"
copyright = "the fuseops authors"
release = fuseops.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Headings down to ### get anchors, so that pages can link to sections.
myst_heading_anchors = 3

# API reference: Google-style docstrings (``Args:``, ``Returns:``, ``Raises:``).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# A method without a docstring of its own shows none (not torch.nn.Module's generic ones).
autodoc_inherit_docstrings = False

html_theme = "furo" if importlib.util.find_spec("furo") else "alabaster"
html_title = f"fuseops {release}"
html_static_path: list[str] = []


def _property_colon(app, what, name, obj, options, lines):
    """Napoleon reads a property docstring's first line ``text: more`` as ``type: description``;
    these docstrings start with prose, so the first colon becomes a dash before napoleon runs."""
    if what == "property" and lines and ": " in lines[0]:
        lines[0] = lines[0].replace(": ", " — ", 1)


def setup(app):
    # Before napoleon's own handler (priority 500).
    app.connect("autodoc-process-docstring", _property_colon, priority=400)
