"""The ```python blocks of the docs' pages run as they stand (README.md's: tests/test_readme.py).

A page's blocks run in order in one namespace, as a reader runs them one after another; a block
whose first line is ``# requires CUDA`` is skipped where CUDA is not available, and one whose
first line is ``# requires a process group`` always (tests/distributed runs those calls). Not run here:
docs/api_contract.md (fragments of a contract, not a program) and docs/guide/distributed.md
(it needs a process group: tests/distributed runs its code). The extension guide's examples are
also exercised: its ``Bias`` op in a ``Sequential`` and its fusion in the registry's place of the
shipped one, both on 3-D inputs against float64 references.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import fuseops
from fuseops import ops
from tests.helpers import run_python

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("docs/concepts.md", "docs/guide/ops.md", "docs/guide/moe.md", "docs/guide/quantization.md",
         "docs/guide/offload.md", "docs/guide/compile.md", "docs/guide/transformers.md",
         "docs/guide/troubleshooting.md", "docs/design/extending.md")
REQUIRES_CUDA = "# requires CUDA"
# Blocks that run on every rank of a process group (tests/distributed runs their calls).
REQUIRES_GROUP = "# requires a process group"


def blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def run_page(page: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Runs the page's blocks in one fresh namespace and returns it."""
    # A reader's fresh process: empty offload planners and torch.compile caches.
    from fuseops.offload import planner

    monkeypatch.setattr(planner, "_planners", {})
    torch._dynamo.reset()
    torch.manual_seed(0)
    namespace: dict = {"__name__": "__doc__"}
    for code in blocks(page):
        if code.startswith(REQUIRES_GROUP) or code.startswith(REQUIRES_CUDA) and not torch.cuda.is_available():
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, page, "exec"), namespace)
    return namespace


def test_every_page_with_python_blocks_is_run_or_said_why_not():
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if blocks(str(p.relative_to(ROOT)))}
    assert pages == set(PAGES) | {"docs/api_contract.md", "docs/guide/distributed.md"}


@pytest.mark.parametrize("page", PAGES)
def test_page_blocks_run(page: str, monkeypatch: pytest.MonkeyPatch):
    if page.endswith("transformers.md"):
        pytest.importorskip("transformers.integrations.moe")
    run_page(page, monkeypatch)


def test_compile_guide_exports_with_extra_inputs():
    text = (ROOT / "docs/guide/compile.md").read_text(encoding="utf-8")
    export = [b for b in blocks("docs/guide/compile.md") if "torch.export.export" in b]
    assert len(export) == 1 and "dynamic_shapes=" in export[0] and "torch.export.load" in export[0]
    assert "import fuseops\nbefore loading it" in text.replace("**", "")


def test_loading_an_exported_program_needs_fuseops_imported(tmp_path):
    # As the compile guide says: a fresh process that has not imported fuseops cannot resolve
    # its custom ops; one that has loads the program.
    experts = fuseops.Sequential(ops.GroupedLinear(2, 8, 16), ops.SwiGLU(), ops.GroupedLinear(2, 8, 8))
    sizes = torch.tensor([3, 5])
    with torch.no_grad():
        program = torch.export.export(experts, (torch.randn(8, 8), sizes, sizes))
    path = tmp_path / "experts.pt2"
    torch.export.save(program, path)
    load = f"import torch; torch.export.load({str(path)!r})"
    bare = run_python("-c", load)
    assert bare.returncode != 0 and "torch.ops.fuseops." in bare.stderr, bare.stderr[-2000:]
    imported = run_python("-c", "import fuseops; " + load)
    assert imported.returncode == 0, imported.stderr[-2000:]


def test_extension_guide_examples_run_on_3d_inputs(monkeypatch: pytest.MonkeyPatch):
    namespace = run_page("docs/design/extending.md", monkeypatch)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)

    bias = namespace["Bias"](16, dtype=torch.float64)
    torch.nn.init.normal_(bias.bias)
    y = fuseops.Sequential(bias)(x)
    y.square().sum().backward()
    torch.testing.assert_close(y, x + bias.bias)
    torch.testing.assert_close(bias.bias.grad, (2 * y).sum(dim=(0, 1)))

    # The guide's fusion in the shipped one's place, counting its calls.
    from fuseops.fusions import REGISTRY

    (index,) = [i for i, f in enumerate(REGISTRY) if type(f).__name__ == "ForwardLinearAddExtraInput"]
    fusion = namespace["ForwardLinearAddExtraInput"]()
    calls = []
    guide_forward = fusion.fused_forward
    fusion.fused_forward = lambda *args: calls.append(args[2].shape) or guide_forward(*args)
    shipped, REGISTRY[index] = REGISTRY[index], fusion
    try:
        seq = fuseops.Sequential(ops.Linear(16, 8, dtype=torch.float64), ops.AddExtraInput())
        residual = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
        y = seq(x, residual)
    finally:
        REGISTRY[index] = shipped
    assert seq.plan.forward == [("ForwardLinearAddExtraInput", (0, 1))], seq.plan.forward
    assert calls == [torch.Size([2, 5, 16])]
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, residual, seq[0].weight, seq[0].bias), dy)
    reference = fuseops.Sequential(*seq, fuse=False)
    y_ref = reference(x, residual)
    grads_ref = torch.autograd.grad(y_ref, (x, residual, seq[0].weight, seq[0].bias), dy)
    torch.testing.assert_close(y, y_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)
