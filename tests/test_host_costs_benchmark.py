"""``benchmarks/host_costs.py --smoke`` on the CPU: every row that needs no GPU runs and is written."""

from __future__ import annotations

import json

from tests.helpers import run_python


def test_smoke_writes_every_cpu_row(tmp_path):
    out = tmp_path / "host_costs.json"
    done = run_python("-m", "benchmarks.host_costs", "--smoke", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["us_per_call"]
    for name in ("torch.addmm", "Sequential(Identity), fwd+bwd", "Sequential(Linear), fwd+bwd",
                 "autograd.Function linear, fwd+bwd", "torch.nn.Linear, fwd+bwd"):
        assert rows[name] > 0, name
