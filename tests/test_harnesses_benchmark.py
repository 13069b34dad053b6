"""``benchmarks/harnesses.py --smoke`` on the CPU: every path the CPU runs is timed in each of its
harnesses and written, the expert layer's user harnesses (``torch.compile``, float32 weights
under ``torch.autocast``) among them."""

from __future__ import annotations

import json

from tests.helpers import run_python


def test_smoke_writes_every_cpu_path(tmp_path):
    out = tmp_path / "harnesses.json"
    done = run_python("-m", "benchmarks.harnesses", "--smoke", "--part", "moe", "--skews", "uniform", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    paths = {r["path"] for r in rows}
    assert paths == {"expert_layer", "expert_layer lean", "torch", "expert_layer compiled", "expert_layer autocast"}
    for r in rows:
        for harness in ("do_bench", "loop", "micro", "switch", "host"):
            assert r[f"{harness}_ms"] > 0, (r["path"], harness)
