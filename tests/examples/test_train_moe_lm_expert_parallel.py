"""``torchrun --nproc-per-node 2 examples/train_moe_lm.py --expert-parallel 2`` on the CPU (gloo): the
experts sharded over two ranks, the rest data-parallel, each rank half of every batch, trains the
same model on the same global batches as one process: in float32 the loss curves agree to rounding,
with the exchange in one piece and in pieces beside the experts; ``--compare-to`` prints the
gaps; the command line refuses what expert parallelism cannot run."""

from __future__ import annotations

import json

import pytest

from benchmarks.train_moe_lm import load_example
from tests.helpers import run_python

pytest.importorskip("transformers.integrations.moe")
pytest.importorskip("tqdm")

lm = load_example()

TINY = ["--device", "cpu", "--steps", "5", "--layers", "2", "--hidden", "32", "--experts", "4", "--top-k", "2",
        "--seq", "32", "--batch", "4", "--lr", "1e-3", "--eval-every", "5", "--data-bytes", "65536"]


def _run(out, *extra, ranks=1):
    launch = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    done = run_python(*launch, "examples/train_moe_lm.py", *TINY, "--out", str(out), *extra, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "train_moe_lm.json").read_text()), done.stdout


def test_expert_parallel_run_matches_one_process(tmp_path):
    one, _ = _run(tmp_path / "one")
    for pieces in ("0", "2"):
        got, stdout = _run(tmp_path / f"ep{pieces}", "--expert-parallel", "2", "--ep-pieces", pieces,
                           "--compare-to", str(tmp_path / "one" / "train_moe_lm.json"), ranks=2)
        assert got["config"]["expert_parallel"] == 2
        # float32: the same sums in another order (the experts' rows arrive by rank).
        for a, b in zip(got["losses"], one["losses"], strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), (got["losses"], one["losses"])
        assert abs(got["final_val_loss"] - one["final_val_loss"]) <= 1e-5 * one["final_val_loss"]
        assert "tokens/s per GPU over 2 ranks" in stdout
        assert "this run vs " in stdout and "mean |loss difference|" in stdout


def test_compare_losses_reports_every_pair(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"losses": [1.0, 2.0]}))
    b.write_text(json.dumps({"losses": [1.5, 2.0, 9.0]}))
    lines = lm.compare_losses([1.0, 2.5], [a, b])
    assert lines == [
        f"this run vs {a}: mean |loss difference| 2.50e-01, max 5.00e-01 over 2 steps",
        f"this run vs {b}: mean |loss difference| 5.00e-01, max 5.00e-01 over 2 steps",
        f"{a} vs {b}: mean |loss difference| 2.50e-01, max 5.00e-01 over 2 steps",
    ]


@pytest.mark.parametrize("flags, message", [
    ({"expert_parallel": 3}, "--experts: expected a multiple of --expert-parallel 3"),
    ({"expert_parallel": 2, "batch": 3}, "--batch: expected a multiple of --expert-parallel 2"),
    ({"expert_parallel": 2, "experts_backend": "eager"}, "--expert-parallel: expected --experts-backend fuseops"),
    ({"expert_parallel": 0}, "expected a positive int and an int >= 0"),
])
def test_refuses_what_it_cannot_run(flags, message):
    with pytest.raises(ValueError, match=message):
        lm.TrainConfig(**({"device": "cpu", "experts": 4, "batch": 4} | flags))


def test_needs_as_many_ranks_as_it_shards_over():
    with pytest.raises(SystemExit, match="expected a launch of as many ranks"):
        lm.Ranks.start(lm.TrainConfig(device="cpu", experts=4, batch=4, expert_parallel=2))
