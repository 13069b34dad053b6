"""``benchmarks/expert_parallel.py --smoke`` end to end: two gloo ranks on the CPU run every
expert-parallel row but the graphed one, agree with the one-GPU layer and plain torch EP in float32,
and write the results file (and its plot) with the rows and targets that the GPU run reports, every
EP row beside the link's bound (this run's all-to-all sweep) and the cost model's step."""

from __future__ import annotations

import importlib.util
import json

from tests.helpers import run_python

ROWS = {"one-GPU", "one-GPU expert_layer", "torch EP", "fuseops EP exact", "fuseops EP overlap=1",
        "fuseops EP overlap=2", "fuseops EP capacity", "fuseops EP chunks=2", "fuseops EP chunks=4"}
ROW_KEYS = {"impl", "tokens_per_gpu", "ms", "forward_ms", "x_one_gpu", "speedup_vs_torch_ep", "peak_above_start_gb",
            "reserved_above_start_gb", "rel_err_vs_one_gpu", "rel_err_vs_torch_ep", "agrees", "dropped_rows"}


def test_smoke_runs_every_path_and_agrees(tmp_path):
    done = run_python("-m", "benchmarks.expert_parallel", "--smoke", "--out-dir", str(tmp_path), timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "plain torch EP, largest relative error" in done.stdout and done.stdout.rstrip().endswith("ok")
    [results] = tmp_path.glob("expert_parallel-x2-cpu-*.json")
    # Without matplotlib the benchmark says so and writes no plot.
    assert results.with_suffix(".png").exists() or importlib.util.find_spec("matplotlib") is None
    data = json.loads(results.read_text())
    assert {"device", "backend", "world_size", "shape", "dtype", "routing", "capacity_factor", "on_overflow",
            "warmup", "steps", "rows", "targets", "link_sweep", "copy_bytes_per_s"} <= set(data)
    assert [size for size, _ in data["link_sweep"]] == [2**12, 2**16]
    assert all(seconds > 0 for _, seconds in data["link_sweep"]) and data["copy_bytes_per_s"] > 0
    one_gpu_ms = next(r["ms"] for r in data["rows"] if r["impl"] == "one-GPU")
    assert (data["backend"], data["world_size"], data["shape"], data["dtype"]) == ("gloo", 2, [4, 16, 8, 2], "float32")
    assert {r["impl"] for r in data["rows"]} == ROWS
    for row in data["rows"]:
        assert ROW_KEYS <= set(row), row
        assert row["tokens_per_gpu"] == 32 and row["ms"] > 0 and row["agrees"], row
        assert row["rel_err_vs_one_gpu"] <= 1e-5, row
        # Capacity factor P in the smoke run: nothing is dropped, the capacity rows are exact.
        assert row["dropped_rows"] == (0 if "capacity" in row["impl"] or "chunks" in row["impl"] else None), row
        if row["impl"].startswith("fuseops EP"):
            assert row["rel_err_vs_torch_ep"] <= 1e-5, row
        if "EP" in row["impl"]:
            assert row["link_ms"] > 0 and row["model_ms"] > 0, row
            assert abs(row["bound_ms"] - one_gpu_ms - row["link_ms"]) < 1e-9, row
    goals = {(g["target"], g["impl"]): g for g in data["targets"]}
    for impl in ROWS - {"one-GPU", "one-GPU expert_layer", "torch EP"}:
        assert goals[("ep_vs_torch_ep", impl)]["met"] in (True, False)
    for impl, bound in (("fuseops EP exact", "<= 1.6"), ("fuseops EP overlap=1", "<= 1.3"),
                        ("fuseops EP overlap=2", "<= 1.3")):
        assert goals[("ep_vs_one_gpu", impl)]["met"] in (True, False)
        assert goals[("ep_vs_one_gpu", impl)]["bound"] == bound
    # The graphed row runs on CUDA only.
    assert goals[("graph_vs_one_gpu", "fuseops EP capacity, graphed")]["met"] is None
