"""``benchmarks/harnesses.py --smoke`` on the CPU: every path the CPU runs is timed in each of its
harnesses and written, the expert layer's user harnesses (``torch.compile``, float32 weights
under ``torch.autocast``) among them, with the peak convention in the file; on a GPU the peak
counts the step's gradient buffers."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks._results import PEAK_CONVENTION
from benchmarks.harnesses import Path_, earlier_rows, peak_gb
from tests.helpers import cuda_or_skip, run_python


def test_smoke_writes_every_cpu_path(tmp_path):
    out = tmp_path / "harnesses.json"
    done = run_python("-m", "benchmarks.harnesses", "--smoke", "--part", "moe", "--skews", "uniform", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["meta"]["peak"] == PEAK_CONVENTION
    assert results["meta"]["commands"] == [
        "python3 -m benchmarks.harnesses --smoke --part moe --skews uniform --out " + str(out)]
    rows = results["rows"]
    paths = {r["path"] for r in rows}
    assert paths == {"expert_layer", "expert_layer lean", "torch", "expert_layer compiled", "expert_layer autocast"}
    for r in rows:
        for harness in ("do_bench", "loop", "micro", "switch", "host"):
            assert r[f"{harness}_ms"] > 0, (r["path"], harness)


def test_merge_keeps_earlier_rows_counted_the_same_way(tmp_path):
    out = tmp_path / "harnesses.json"
    assert earlier_rows(out) == ([], [])
    out.write_text(json.dumps({"meta": {"commands": ["a"], "peak": PEAK_CONVENTION}, "rows": [{"path": "x"}]}))
    assert earlier_rows(out) == (["a"], [{"path": "x"}])
    out.write_text(json.dumps({"meta": {"commands": ["a"]}, "rows": [{"path": "x"}]}))
    with pytest.raises(SystemExit, match="counts peak memory otherwise"):
        earlier_rows(out)


@pytest.mark.gpu
def test_peak_counts_the_steps_gradient_buffers():
    # After a step the weight's gradient (4 MiB) is held; the measured step must still count
    # it, as a first step would, not free it and make it again unseen.
    device = cuda_or_skip()
    model = torch.nn.Linear(1024, 1024, bias=False, device=device)
    path = Path_("linear", model, lambda n: torch.randn(n, 1024, device=device, requires_grad=True),
                 list(model.parameters()))
    path.step(path.inputs(8))
    allocated, _ = peak_gb(path, 8, "cuda")
    assert allocated * 1e9 >= 1024 * 1024 * 4
