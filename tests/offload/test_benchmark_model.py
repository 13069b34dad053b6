"""benchmarks/offload.py on a CPU: each mode's step is bitwise the step without offloading,
and ``--smoke`` writes steps 1-6 of every mode for both stacks."""

import json

import pytest
import torch
from torch import nn

from benchmarks.offload import MODES, STACKS, STEPS, main, step
from fuseops.offload import link_budget, mark_not_offload


@pytest.mark.parametrize("kind", sorted(STACKS))
@pytest.mark.parametrize("mode", [m for m in MODES if m != "none"])
def test_every_mode_of_the_benchmark_is_bitwise(kind, mode):
    torch.manual_seed(0)
    layers = nn.ModuleList(STACKS[kind](64) for _ in range(3))
    x = torch.randn(1024, 64)
    mark_not_offload(x)

    def grads(mode, target=None):
        for p in layers.parameters():
            p.grad = None
        stats = step(layers, x, mode, target)
        return [p.grad.clone() for p in layers.parameters()], stats

    want, _ = grads("none")
    got, stats = grads(mode, 2**40 if mode == "target" else None)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    if stats is not None:
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"]
        assert stats["skipped_marked"] >= 1  # the input


def test_smoke_writes_every_step_of_every_mode(tmp_path):
    main(["--smoke", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("offload-cpu-*.json")
    result = json.loads(path.read_text())
    for kind in STACKS:
        modes = result["stacks"][kind]
        assert [m["mode"] for m in modes] == list(MODES)
        for m in modes:
            assert "error" not in m and len(m["steps"]) == STEPS, m
        moved = {m["mode"]: [s.get("bytes_offloaded") for s in m["steps"]] for m in modes}
        # The same bytes from the first step, in every fuseops mode.
        for mode in ("default", "target", "everything"):
            assert len(set(moved[mode])) == 1, (kind, mode, moved[mode])
        target = next(m for m in modes if m["mode"] == "target")
        assert all(s["peak_bytes"] <= target["target"] for s in target["steps"])


def test_link_budget_arithmetic():
    # 6 ms of forward at 54 GB/s, planning for 90% of the link.
    assert link_budget(6e-3) == int(6e-3 * 54e9 * 0.9)
    assert link_budget(1e-3, bytes_per_s=10e9, margin=1.0) == 10_000_000
    # 54 MB per millisecond of forward at 54 GB/s: a 2 ms layer hides 108 MB, 97 MB planned.
    assert link_budget(2e-3, margin=1.0) == 108_000_000 and link_budget(2e-3) == 97_200_000
