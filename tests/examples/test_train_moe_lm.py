"""examples/train_moe_lm.py: a tiny Qwen3-MoE byte model learns the standard library's text
with its experts on fuseops exactly as with transformers' eager experts (same seed, same
weights, same batches), ``grouped_mm-autocast`` runs transformers' grouped_mm on the experts'
weights cast as autocast casts them, and the command line refuses what it cannot run."""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.train_moe_lm import load_example

pytest.importorskip("transformers.integrations.moe")

lm = load_example()

# lr 1e-3: at 3e-3 this tiny model's training is chaotic enough that float32 rounding
# (1e-7 relative per step) grows past 1e-4 within 40 steps for 2 seeds in 10 (a routing
# near-tie decided the other way, then amplified); at 1e-3 it stays below 1e-6 for all 10.
TINY = lm.TrainConfig(steps=40, device="cpu", layers=2, hidden=32, experts=4, top_k=2, seq=64, batch=8,
                      lr=1e-3, eval_every=0, seed=0)


def _losses(cfg) -> list[float]:
    return lm.train(cfg, progress=False).losses


def _bf16_curves_agree(cfg, other) -> tuple[list[float], list[float]]:
    """Both configurations' loss curves, after checking that their mean |difference| is at most
    0.005 (the bf16 bound of the tests below)."""
    got, ref = _losses(cfg), _losses(other)
    diffs = [abs(a - b) for a, b in zip(got, ref, strict=True)]
    mean = sum(diffs) / len(diffs)
    print(f"bfloat16, {cfg.steps} steps: mean |loss difference| {mean:.2e}, max {max(diffs):.2e}")
    assert mean <= 0.005, diffs
    return got, ref


def _rel_diffs(got: list[float], ref: list[float]) -> list[float]:
    return [abs(a - b) / abs(b) for a, b in zip(got, ref, strict=True)]


def test_data_is_deterministic_and_held_out():
    text = lm.stdlib_text(4096)
    assert text == lm.stdlib_text(4096) and len(text) == 4096
    train, val = lm.split_tokens(text)
    assert len(train) + len(val) == 4096 and len(val) == pytest.approx(409.6, abs=1)
    assert torch.equal(torch.cat([train, val]), torch.tensor(list(text)))
    inputs, targets = next(lm.random_batches(train, 3, 16, seed=0))
    assert inputs.shape == targets.shape == (3, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    batches = lm.fixed_batches(val, 2, 16, count=100)
    assert len(batches) == (len(val) - 1) // 16 // 2


def test_fuseops_experts_train_as_eager_float32():
    fuseops_losses = _losses(TINY)
    eager_losses = _losses(replace(TINY, experts_backend="eager"))
    diffs = _rel_diffs(fuseops_losses, eager_losses)
    print(f"float32, {TINY.steps} steps: max relative loss difference {max(diffs):.2e}")
    assert max(diffs) <= 1e-4, f"step {diffs.index(max(diffs)) + 1}: {max(diffs):.2e}"
    first, last = lm.smoothed_ends(fuseops_losses)
    assert last < first - 0.5, (first, last)


def test_fuseops_experts_train_as_eager_bfloat16():
    # Both backends run the experts' GEMMs in bf16 under torch.autocast but round at
    # different points (eager: each expert's Linear output and the gate product; fuseops:
    # once, after its float32 epilogue). Averaged over the batch's tokens, these roundings
    # must move the loss less than bf16 can resolve the loss itself: half the spacing of
    # bf16 numbers is 0.008 in [2, 4) and 0.016 in [4, 8); the bound on the mean is 0.005
    # (measured: at most 3e-4 over seeds 0-7).
    cfg = replace(TINY, dtype="bfloat16")
    fuseops_losses, _ = _bf16_curves_agree(cfg, replace(cfg, experts_backend="eager"))
    first, last = lm.smoothed_ends(fuseops_losses)
    assert last < first - 0.5, (first, last)


def test_grouped_mm_autocast_is_grouped_mm_on_the_cast_weights():
    # Under autocast: exactly transformers' grouped_mm on a bf16 copy of the experts, and the
    # gradients reach the float32 master weights as the copy's, cast up; outside autocast: plain
    # grouped_mm on the float32 weights.
    from transformers.integrations.moe import grouped_mm_experts_forward

    model = lm.build_model(replace(TINY, layers=1, experts_backend="grouped_mm-autocast"))
    experts = model.model.layers[0].mlp.experts
    bf16 = copy.deepcopy(experts).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(48, TINY.hidden, generator=generator)
    top_k_index = torch.rand(48, TINY.experts, generator=generator).topk(TINY.top_k).indices
    top_k_weights = torch.rand(48, TINY.top_k, generator=generator).softmax(-1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = lm.grouped_mm_autocast_experts_forward(experts, tokens, top_k_index, top_k_weights)
        want = grouped_mm_experts_forward(bf16, tokens, top_k_index, top_k_weights)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, master), (_, cast) in zip(experts.named_parameters(), bf16.named_parameters(), strict=True):
        assert master.dtype == master.grad.dtype == torch.float32, name
        assert torch.equal(master.grad, cast.grad.float()), name
    plain = lm.grouped_mm_autocast_experts_forward(experts, tokens, top_k_index, top_k_weights)
    assert torch.equal(plain, grouped_mm_experts_forward(experts, tokens, top_k_index, top_k_weights))
    assert not torch.equal(plain, got)


def test_grouped_mm_autocast_trains_as_grouped_mm_bfloat16():
    # grouped_mm multiplies in float32 (its tokens cast to the float32 weights), grouped_mm-autocast
    # in bf16: the difference is bf16 rounding, averaged over the batch's tokens, the bound of the
    # fuseops-against-eager test (measured: at most 2e-4 over seeds 0-3).
    cfg = replace(TINY, dtype="bfloat16", experts_backend="grouped_mm-autocast")
    autocast_losses, grouped_mm_losses = _bf16_curves_agree(cfg, replace(cfg, experts_backend="grouped_mm"))
    for losses in (autocast_losses, grouped_mm_losses):
        first, last = lm.smoothed_ends(losses)
        assert last < first - 0.5, (first, last)


def test_grouped_mm_autocast_keeps_float32_weights_with_gradients():
    cfg = replace(TINY, dtype="bfloat16", experts_backend="grouped_mm-autocast")
    model = lm.build_model(cfg)
    inputs, targets = next(lm.random_batches(lm.split_tokens(lm.stdlib_text(2**16))[0], 2, 32, seed=0))
    with lm.forward_context(cfg):
        loss = lm.lm_loss(model, inputs, targets)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32, name
        assert param.grad is not None and param.grad.dtype == torch.float32, name
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts.gate_up_proj, torch.nn.Parameter) and experts.gate_up_proj.grad.abs().sum() > 0


@pytest.mark.parametrize(("backend", "dtype", "refused"), [
    ("grouped_mm", "bfloat16", True),
    ("grouped_mm-autocast", "float32", True),
    ("grouped_mm-autocast", "bfloat16", False),
    ("fuseops", "float32", False),
])
def test_graphs_with_compile_refuses_float32_grouped_mm(backend, dtype, refused):
    # _check_graphs itself, with a CUDA device: this machine may have none.
    cfg = lm.TrainConfig(device="cpu", dtype=dtype, experts_backend=backend, compile=True)
    if refused:
        with pytest.raises(ValueError, match=f"--experts-backend {backend} with --dtype {dtype} passes them "
                                             "float32 weights"):
            cfg._check_graphs(torch.device("cuda"))
    else:
        cfg._check_graphs(torch.device("cuda"))


def test_main_writes_results_and_says_ok(tmp_path, capsys):
    argv = ["--device", "cpu", "--steps", "12", "--layers", "1", "--hidden", "32", "--experts", "4",
            "--seq", "32", "--batch", "4", "--eval-every", "6", "--out", str(tmp_path)]
    assert lm.main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("OK:")
    result = json.loads((tmp_path / "train_moe_lm.json").read_text())
    assert len(result["losses"]) == 12 and [s for s, _ in result["val_losses"]] == [6, 12]
    assert result["final_val_loss"] == result["val_losses"][-1][1]
    assert result["config"]["experts_backend"] == "fuseops" and result["tokens_per_s"] > 0
    assert result["peak_memory_bytes"] > 0
    pytest.importorskip("matplotlib")
    assert (tmp_path / "train_moe_lm.png").read_bytes()[:4] == b"\x89PNG"


def test_main_runs_without_the_bench_extra_into_a_folder_it_makes(tmp_path, capsys, monkeypatch):
    # Neither tqdm nor matplotlib importable, no --out: progress lines, the JSON and no PNG, in
    # a new folder under the temporary folder (named in the output), nothing in the current one.
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = ["--device", "cpu", "--steps", "10", "--layers", "1", "--hidden", "32", "--experts", "4",
            "--seq", "32", "--batch", "4", "--eval-every", "0"]
    assert lm.main(argv) == 0
    out = capsys.readouterr().out
    (folder,) = tmp_path.glob("train_moe_lm-*")
    assert sorted(p.name for p in folder.iterdir()) == ["train_moe_lm.json"]
    assert f"wrote {Path(folder) / 'train_moe_lm.json'} (no plot: matplotlib is not installed" in out
    assert "fuseops step 10/10 loss=" in out
    assert not any(cwd.iterdir())


def test_main_says_fail_when_the_loss_does_not_fall(tmp_path, capsys, monkeypatch):
    rising = [3.0 + 0.1 * i for i in range(10)]
    monkeypatch.setattr(lm, "train", lambda cfg: lm.TrainResult(cfg, rising, [], 1.0, 1, 1.0, {}))
    assert lm.main(["--device", "cpu", "--steps", "10", "--out", str(tmp_path)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("FAIL: smoothed train loss 3.0500 -> 3.8500"), last


def test_offload_trains_bit_for_bit():
    # The default model: its larger saved tensors pass offloading's 256 KiB minimum.
    cfg = lm.TrainConfig(steps=6, device="cpu", eval_every=0)
    plain = lm.train(cfg, progress=False)
    offloaded = lm.train(replace(cfg, offload=True), progress=False)
    assert offloaded.losses == plain.losses
    assert offloaded.offload_stats["bytes_offloaded"] > 0 and not plain.offload_stats


def test_graphs_on_cpu_is_refused(capsys):
    with pytest.raises(ValueError, match="--graphs .* needs a CUDA device, got --device cpu"):
        lm.TrainConfig(device="cpu", graphs=True)
    with pytest.raises(SystemExit) as exit_info:
        lm.main(["--device", "cpu", "--graphs"])
    assert exit_info.value.code == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--recipe", "mxfp8", "--experts-backend", "eager"], "apply to the fuseops experts backend only"),
    (["--experts", "4", "--top-k", "5"], "--top-k: expected at most --experts (4), got 5"),
    (["--hidden", "48"], "--hidden: expected a multiple of 32, got 48"),
    (["--steps", "0"], "--steps: expected a positive int, got 0"),
    (["--lr", "-1"], "--lr: expected a positive float, got -1.0"),
    (["--recipe", "fp16"], "invalid choice: 'fp16'"),
    (["--experts-backend", "batched"], "invalid choice: 'batched'"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
    (["--device", "gpu"], "--device: expected cpu, cuda or cuda:N, got 'gpu'"),
    (["--batch", "64", "--seq", "2048"], "the held-out text (104857 bytes) must hold one batch"),
    (["--data-bytes", "4096", "--seq", "512"], "the held-out text (409 bytes) must hold one batch"),
    (["--moe-intermediate", "0"], "--moe-intermediate: expected a positive int, got 0"),
])
def test_bad_flags_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        lm.main(["--device", "cpu", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_config_refuses_what_the_command_line_would():
    with pytest.raises(ValueError, match="--experts-backend: expected one of fuseops, eager, grouped_mm, "
                       "grouped_mm-autocast, batched_mm, deepgemm, sonicmoe, got 'x'"):
        lm.TrainConfig(device="cpu", experts_backend="x")
    with pytest.raises(ValueError, match="--dtype: expected one of float32, bfloat16, got 'float16'"):
        lm.TrainConfig(device="cpu", dtype="float16")


@pytest.mark.gpu
def test_graphs_and_compile_bfloat16_on_cuda(tmp_path):
    cfg = replace(TINY, device="cuda", dtype="bfloat16", steps=20)
    plain = _losses(cfg)
    captured = _losses(replace(cfg, graphs=True, compile=True))
    diffs = [abs(a - b) for a, b in zip(captured, plain, strict=True)]
    assert sum(diffs) / len(diffs) <= 0.02, diffs
    assert lm.main(["--device", "cuda", "--dtype", "bfloat16", "--steps", "20", "--graphs", "--compile",
                    "--out", str(tmp_path)]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["fp8-current", "fp8-blockwise", "mxfp8", "nvfp4"])
def test_recipes_train_on_cuda(recipe):
    cfg = replace(TINY, device="cuda", dtype="bfloat16", hidden=128, steps=30, recipe=recipe)
    result = lm.train(cfg, progress=False)
    assert result.fell, result.losses


def test_gradient_bytes_counts_the_held_gradient_buffers():
    model = torch.nn.Linear(4, 3)
    assert lm.gradient_bytes(model) == 0
    model(torch.randn(2, 4)).sum().backward()
    assert lm.gradient_bytes(model) == (4 * 3 + 3) * 4


@pytest.mark.gpu
def test_step_peak_counts_the_steps_gradient_buffers():
    # The previous step's gradient (4 MiB) is held as the step begins and freed inside it
    # (zero_grad); the step's peak still counts the new one, as a first step's would.
    device = torch.device("cuda") if torch.cuda.is_available() else pytest.skip("needs a CUDA GPU")
    model = torch.nn.Linear(1024, 1024, bias=False, device=device)
    model(torch.randn(8, 1024, device=device)).sum().backward()
    meter = lm.MemoryMeter(device)
    meter.step_begins(lm.gradient_bytes(model))
    model.weight.grad = None
    model(torch.randn(8, 1024, device=device)).sum().backward()
    torch.cuda.synchronize()
    meter.step_ends()
    assert meter.step_allocated >= 1024 * 1024 * 4
