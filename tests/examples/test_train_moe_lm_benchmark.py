"""benchmarks/train_moe_lm.py on a CPU: ``--smoke`` end to end (each run in its own process, the
results file and its plot), ``--merge`` keeping the runs a call does not repeat, ``--timeout``,
and the figures the table and the targets' checks are made of."""

from __future__ import annotations

import json

import pytest

from benchmarks import train_moe_lm as bench

pytest.importorskip("transformers.integrations.moe")
pytest.importorskip("matplotlib")
bench.load_example()

ROW_KEYS = {"run", "tokens_per_s", "peak_alloc_gb", "peak_reserved_gb", "step_alloc_gb", "step_reserved_gb",
            "final_train_loss", "final_val_loss", "loss_mad_vs_baseline", "loss_mad_vs_fuseops",
            "speedup_vs_baseline", "speedup_vs_fuseops", "val_rel_vs_fuseops"}


def test_smoke_writes_results_and_plot_then_merges(tmp_path, capsys, monkeypatch):
    # The runs' processes take fuseops' CPU path, as the command line does, not the Triton
    # interpreter tests/conftest.py sets for the kernel tests (fuseops, imported above with it, keeps it).
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "train_moe_lm.json"
    bench.main(["--smoke", "--runs", "fuseops", "grouped_mm-autocast", "deepgemm", "fuseops-fp8",
                "--out", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith(f"wrote {out}")
    result = json.loads(out.read_text())
    assert set(result) == {"meta", "config", "runs", "baseline", "rows", "checks"}
    assert result["config"] == {**bench.SMOKE, "device": "cpu", "dtype": "bfloat16"}
    runs = result["runs"]
    # In RUNS' order, whatever the order asked.
    assert list(runs) == ["fuseops", "grouped_mm-autocast", "fuseops-fp8", "deepgemm"]
    assert runs["deepgemm"] == {"skipped": "deepgemm needs a CUDA GPU"}
    measured = ("fuseops", "grouped_mm-autocast", "fuseops-fp8")
    for name in measured:
        assert len(runs[name]["losses"]) == bench.SMOKE["steps"]
        assert runs[name]["tokens_per_s"] > 0 and runs[name]["final_val_loss"] is not None
    # Same seed, same weights, same batches: the runs start from the same loss.
    first = [runs[name]["losses"][0] for name in measured]
    assert max(first) - min(first) <= 1e-3, first
    assert result["baseline"] == "grouped_mm-autocast"
    assert any(line.startswith("baseline: grouped_mm-autocast,") for line in printed)
    rows = {row["run"]: row for row in result["rows"]}
    assert set(rows["fuseops"]) == ROW_KEYS
    assert rows["deepgemm"] == {"run": "deepgemm", "skipped": runs["deepgemm"]["skipped"]}
    base = rows["grouped_mm-autocast"]
    assert base["speedup_vs_baseline"] == 1.0 and base["loss_mad_vs_baseline"] == 0.0
    assert rows["fuseops"]["loss_mad_vs_baseline"] <= 0.02
    assert set(result["checks"]) == {key for _, key, _, _ in bench.TARGETS}
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    bench.main(["--smoke", "--runs", "fuseops-offload", "grouped_mm", "--merge", "--out", str(out)])
    merged = json.loads(out.read_text())
    assert list(merged["runs"]) == ["fuseops", "grouped_mm-autocast", "fuseops-fp8", "fuseops-offload",
                                    "grouped_mm", "deepgemm"]
    assert merged["runs"]["fuseops"] == runs["fuseops"]
    assert merged["runs"]["fuseops-offload"]["losses"] == runs["fuseops"]["losses"]
    # The baseline is the faster of the two grouped_mm runs, over the kept runs and the new.
    transformers_runs = {name: merged["runs"][name]["tokens_per_s"] for name in ("grouped_mm-autocast", "grouped_mm")}
    assert merged["baseline"] == max(transformers_runs, key=transformers_runs.get)
    merged_rows = {row["run"]: row for row in merged["rows"]}
    assert merged_rows[merged["baseline"]]["speedup_vs_baseline"] == 1.0
    assert [c.split("--runs ")[1].split(" --")[0] for c in merged["meta"]["commands"]] == [
        "fuseops grouped_mm-autocast deepgemm fuseops-fp8", "fuseops-offload grouped_mm"]


def test_merge_refuses_another_configuration(tmp_path):
    out = tmp_path / "train_moe_lm.json"
    config = {**bench.SMOKE, "steps": 7, "device": "cpu", "dtype": "bfloat16"}
    out.write_text(json.dumps({"config": config, "runs": {}}))
    with pytest.raises(SystemExit, match=r"holds runs of another configuration.*'steps': \(7, 12\)"):
        bench.main(["--smoke", "--runs", "fuseops", "--merge", "--out", str(out)])


def test_timeout_stops_a_run():
    fields = {**bench.SMOKE, "device": "cpu", "dtype": "bfloat16", "experts_backend": "fuseops"}
    assert bench.launch("fuseops", fields, timeout_s=0.5) == {"skipped": "stopped by --timeout 0 s"}


def _run(losses, tokens_per_s, val):
    return {"losses": losses, "tokens_per_s": tokens_per_s, "peak_memory_bytes": 2e9, "peak_reserved_bytes": 3e9,
            "step_peak_allocated_bytes": 1e9, "step_peak_reserved_bytes": 0, "final_smoothed_loss": losses[-1],
            "final_val_loss": val}


def test_summary_figures_and_checks(capsys):
    base = [3.0 - 0.01 * i for i in range(150)]
    runs = {"fuseops": _run([x + 0.01 for x in base], 1500.0, 2.0), "grouped_mm-autocast": _run(base, 1000.0, 2.1),
            "fuseops-fp8": _run(base, 1650.0, 2.03), "grouped_mm": _run([x + 0.5 for x in base], 400.0, 2.6),
            "sonicmoe": {"skipped": "not here"}, "fuseops-offload": _run([x + 0.013 for x in base], 1400.0, 2.0)}
    # The fastest transformers run that ran, fuseops' runs aside.
    assert bench.baseline(runs) == "grouped_mm-autocast"
    rows, checks = bench.summarize(runs, compare_last=100)
    fuse, fp8, grouped_mm = rows[0], rows[2], rows[3]
    assert fuse["speedup_vs_baseline"] == 1.5 and fuse["loss_mad_vs_baseline"] == pytest.approx(0.01)
    assert grouped_mm["speedup_vs_baseline"] == 0.4 and grouped_mm["loss_mad_vs_baseline"] == pytest.approx(0.5)
    assert fp8["speedup_vs_fuseops"] == pytest.approx(1.1) and fp8["val_rel_vs_fuseops"] == pytest.approx(0.015)
    assert fp8["loss_mad_vs_fuseops"] == pytest.approx(0.01) and fuse["loss_mad_vs_fuseops"] == 0.0
    assert fuse["peak_alloc_gb"] == 2.0 and fuse["step_reserved_gb"] == 0.0
    assert rows[4] == {"run": "sonicmoe", "skipped": "not here"}
    met = {key: check["met"] for key, check in checks.items()}
    assert met == {"fuseops_speedup": True, "fuseops_peak_ratio": True, "fuseops_step_peak_ratio": True,
                   "fuseops_loss_mad": True, "fp8_speedup": False, "fp8_val_rel": False}
    bench.print_table(rows, checks, bench.baseline(runs))
    printed = capsys.readouterr().out
    assert "baseline: grouped_mm-autocast, the transformers run with the most tokens/s" in printed
    # The floor: fuseops-offload against fuseops, whose values are the same.
    assert "run-to-run floor: mean |loss - fuseops'| of fuseops-offload (the same values) = 0.0030" in printed

    # Against the float32 grouped_mm alone, fuseops' speedup is larger.
    del runs["grouped_mm-autocast"]
    assert bench.baseline(runs) == "grouped_mm"
    rows, checks = bench.summarize(runs, compare_last=100)
    assert checks["fuseops_speedup"]["value"] == 3.75
    assert bench.baseline({"fuseops": runs["fuseops"], "sonicmoe": runs["sonicmoe"]}) is None
