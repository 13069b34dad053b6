"""``benchmarks/gathered_gemm.py --smoke`` on the CPU: every GEMM and variant of the table runs,
agrees with the contiguous GEMM, and is written."""

from __future__ import annotations

import json

from tests.helpers import run_python


def test_smoke_writes_every_gemm_and_variant(tmp_path):
    out = tmp_path / "gathered_gemm.json"
    done = run_python("-m", "benchmarks.gathered_gemm", "--smoke", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    seen = {(r["routing"], r["gemm"], r["variant"]) for r in rows}
    for routing in ("uniform", "skewed"):
        for gemm in ("fc1_fwd", "fc2_dgrad", "fc1_wgrad", "fc2_wgrad"):
            for variant in ("copy", "contiguous", "gathered"):
                assert (routing, gemm, variant) in seen, (routing, gemm, variant)
    assert all(r["ms"] > 0 and r["rel_err"] < 1e-2 for r in rows), rows
