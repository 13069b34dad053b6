"""Every ```python block of README.md is a test, and the README's commands are the ones CI runs.

Each block is self-contained: it runs alone, in a fresh namespace, in the order the README
gives it (one test per block, so the blocks may run on different pytest-xdist workers). A
block whose first line is ``# requires CUDA`` is skipped where CUDA is not available. The
shapes are small: all blocks together take well under a minute on a CPU.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
REQUIRES_CUDA = "# requires CUDA"
# Words of a development diary, which neither the README nor the docs hold.
HISTORY = re.compile(r"\bsessions? \d+|\bsession\d+|closing[ _-]notes?\b|\bissues? \d+", re.IGNORECASE)

# A fenced block opened by ```python at the start of a line, closed by ``` on its own line.
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL)


def _block_id(index: int, code: str) -> str:
    """The block's number and the README heading above it (``3-activation-offloading``)."""
    start = README.index(code)
    headings = re.findall(r"^#+ (.+)$", README[:start], flags=re.MULTILINE)
    title = re.sub(r"[^a-z0-9]+", "-", headings[-1].lower()).strip("-") if headings else "top"
    return f"{index}-{title}"


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 6, f"expected the README's tour in ```python blocks, found {len(BLOCKS)}"


@pytest.mark.parametrize("code", BLOCKS, ids=[_block_id(i, c) for i, c in enumerate(BLOCKS)])
def test_readme_block(code: str):
    if code.startswith(REQUIRES_CUDA) and not torch.cuda.is_available():
        pytest.skip("README block marked '# requires CUDA'")
    # A reader's fresh process: torch.compile's caches start empty (other tests in this
    # process compiled the same code).
    torch._dynamo.reset()
    namespace = {"__name__": "__readme__"}
    torch.manual_seed(0)
    # The blocks print what a reader would see; the test keeps it out of pytest's output.
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "README.md", "exec"), namespace)


def _shell_commands() -> list[str]:
    """The README's indented shell commands (four spaces, outside fenced blocks)."""
    return [line[4:] for line in README.splitlines() if line.startswith("    python3 ")]


def test_ci_runs_the_readme_test_command():
    tests = [c for c in _shell_commands() if "pytest" in c]
    assert len(tests) == 1, f"expected one test command in README.md, found {tests}"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests[0] in ci, f".ci/run does not run README.md's test command {tests[0]!r}"


def test_ci_builds_the_docs_strictly():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci
    assert re.search(r"python3 -m sphinx -W --keep-going .*-b html docs docs/_build/html", ci)


def test_readme_quickstart_command_names_an_example_that_exists():
    (main,) = [c for c in _shell_commands() if "examples/" in c]
    script = re.search(r"python3 (examples/\S+\.py)", main).group(1)
    assert (ROOT / script).is_file()


def test_readme_is_a_readme():
    assert len(README.encode("utf-8")) <= 40_000
    assert "../shared" not in README
    assert not HISTORY.search(README)


def test_docs_stay_inside_the_repository_and_out_of_its_history():
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert pages, "expected the documentation's Markdown pages under docs/"
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text, f"{page.relative_to(ROOT)} points outside the repository"
        found = HISTORY.search(text)
        assert not found, f"{page.relative_to(ROOT)}: development-history words {found.group(0)!r}"
