"""Train a small Qwen3-MoE-style byte-level language model on the Python standard library's sources.

    python examples/train_moe_lm.py --steps 30 --device cpu
    python examples/train_moe_lm.py --device cuda --dtype bfloat16 --steps 2000 --hidden 512 \\
        --layers 4 --experts 32 --top-k 4 --seq 512 --batch 16 --recipe mxfp8 --graphs

The model is transformers' own ``Qwen3MoeForCausalLM`` (random, small, one token per byte:
nothing to download) with its experts on ``--experts-backend``: ``fuseops``, one of
transformers' experts implementations (``eager``, ``grouped_mm``, ``batched_mm``; ``deepgemm``
and ``sonicmoe`` load their kernels through the ``kernels`` package), or ``grouped_mm-autocast``:
transformers' ``grouped_mm`` with the experts' weights cast as autocast casts a Linear's (below).
This is the recommended way to compare backends: one seed gives the same weights and the same
batches on each, so runs differ only in how the experts compute. The text is the standard
library's ``.py`` files (sorted paths, ``--data-bytes`` of them), its last tenth held out for the
validation loss.
``benchmarks/train_moe_lm.py`` runs it at a real size on each backend.

bfloat16 keeps float32 master weights under ``torch.autocast``, so AdamW's small updates are not
rounded away. torch's grouped_mm is not autocast-enabled and transformers' ``grouped_mm`` casts the
tokens to the weights' dtype, so there it multiplies in float32; ``grouped_mm-autocast`` casts the
experts' weights to bf16 for the call instead (differentiably, as autocast does), so its GEMMs run
in bf16 like every other backend's.
Expert parallelism: ``torchrun --nproc-per-node P examples/train_moe_lm.py --expert-parallel P ...``
shards every layer's experts over the P ranks (``moe_expert_parallel.py``: ``fuseops.moe.dispatch`` /
``combine``; ``--ep-pieces K`` overlaps the exchange with the experts through ``dispatch_chunks``) and
keeps the rest data-parallel (DDP). Each rank takes its 1/P of every batch, so the global batch is a
one-process run's; the loss printed is the mean over all ranks' tokens, and tokens/s is per GPU.
``--compare-to A.json B.json`` prints this run's loss curve against earlier runs' and theirs
against each other (two one-process runs, on two backends, give the floor that rounding sets).
``--recipe`` quantizes the experts' GEMMs (fuseops backend only); ``--graphs`` captures the whole
step (forward, backward, AdamW) in one ``torch.cuda.graph`` on static inputs (CUDA only). Writes
train_moe_lm.json and train_moe_lm.png into ``--out`` (by default a new folder under the system's
temporary folder, printed); the last line is ``OK:`` when the smoothed training loss fell, else
``FAIL:`` (exit code 1). The progress bar and the PNG need the ``bench`` extra (tqdm,
matplotlib); without it the run prints progress lines and writes the JSON only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils.stateless import _reparametrize_module

import fuseops

# The expert-parallel pieces beside this file (``examples/`` is not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_expert_parallel as ep  # noqa: E402

BACKENDS = ("fuseops", "eager", "grouped_mm", "grouped_mm-autocast", "batched_mm", "deepgemm", "sonicmoe")
GROUPED_MM_AUTOCAST = "grouped_mm-autocast"
RECIPES: dict[str, Callable[[], fuseops.recipes.Recipe] | None] = {
    "none": None,
    "fp8-current": fuseops.recipes.FP8CurrentScaling,
    "fp8-blockwise": fuseops.recipes.FP8Blockwise,
    "mxfp8": fuseops.recipes.MXFP8,
    "nvfp4": fuseops.recipes.NVFP4,
}
DTYPES = ("float32", "bfloat16")
DATA_BYTES = 2**20
VAL_FRACTION = 0.1
EVAL_BATCHES = 4
# --graphs runs this many eager steps before it captures the next one.
WARMUP_STEPS = 3
# Steps not counted in tokens/s: the first calls build plans, compile, or capture.
UNTIMED_STEPS = WARMUP_STEPS + 1
_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class TrainConfig:
    """One training run; every field is a command-line flag of the same name."""

    steps: int = 200
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    dtype: str = "float32"
    layers: int = 2
    hidden: int = 64
    # The experts' FFN width; None: --hidden.
    moe_intermediate: int | None = None
    experts: int = 8
    top_k: int = 2
    seq: int = 128
    batch: int = 8
    lr: float = 3e-3
    recipe: str = "none"
    offload: bool = False
    compile: bool = False
    graphs: bool = False
    experts_backend: str = "fuseops"
    eval_every: int = 10
    data_bytes: int = DATA_BYTES
    seed: int = 0
    # Ranks that share the experts (under torchrun, the world size); 1: no expert parallelism.
    expert_parallel: int = 1
    # 0: the exchange in one piece (dispatch); K: the remote rows in K pieces beside the experts.
    ep_pieces: int = 0

    def __post_init__(self) -> None:
        for name, value, valid in (("--dtype", self.dtype, DTYPES), ("--recipe", self.recipe, tuple(RECIPES)),
                                   ("--experts-backend", self.experts_backend, BACKENDS)):
            if value not in valid:
                raise ValueError(f"{name}: expected one of {', '.join(valid)}, got {value!r}")
        for name in ("steps", "layers", "hidden", "experts", "top_k", "seq", "batch", "data_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(self, name)}")
        if self.moe_intermediate is not None and self.moe_intermediate < 1:
            raise ValueError(f"--moe-intermediate: expected a positive int, got {self.moe_intermediate}")
        if self.eval_every < 0:
            raise ValueError(f"--eval-every: expected 0 (never) or a positive int, got {self.eval_every}")
        if not self.lr > 0:
            raise ValueError(f"--lr: expected a positive float, got {self.lr}")
        if self.top_k > self.experts:
            raise ValueError(f"--top-k: expected at most --experts ({self.experts}), got {self.top_k}")
        if self.hidden % head_dim(self.hidden):
            raise ValueError(f"--hidden: expected a multiple of {head_dim(self.hidden)}, got {self.hidden}")
        if self.recipe != "none" and self.experts_backend != "fuseops":
            raise ValueError(
                f"--recipe {self.recipe}: quantization recipes apply to the fuseops experts backend only, "
                f"got --experts-backend {self.experts_backend}"
            )
        if self.eval_every and self.batch * self.seq >= int(self.data_bytes * VAL_FRACTION):
            raise ValueError(
                f"--batch {self.batch} x --seq {self.seq}: the held-out text ({int(self.data_bytes * VAL_FRACTION)} "
                f"bytes) must hold one batch; expected a smaller product, more --data-bytes, or --eval-every 0"
            )
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise ValueError(f"--device: expected cpu, cuda or cuda:N, got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: CUDA is not available on this machine")
        if self.graphs:
            self._check_graphs(device)
        if self.expert_parallel != 1 or self.ep_pieces:
            self._check_expert_parallel()

    def _check_expert_parallel(self) -> None:
        if self.expert_parallel < 1 or self.ep_pieces < 0:
            raise ValueError(f"--expert-parallel {self.expert_parallel} --ep-pieces {self.ep_pieces}: expected "
                             "a positive int and an int >= 0")
        for name, value in (("--experts", self.experts), ("--batch", self.batch)):
            if value % self.expert_parallel:
                raise ValueError(f"{name}: expected a multiple of --expert-parallel {self.expert_parallel}, "
                                 f"got {value}")
        if self.experts_backend != "fuseops" or self.recipe != "none" or self.graphs or self.compile or self.offload:
            raise ValueError("--expert-parallel: expected --experts-backend fuseops without --recipe, --graphs, "
                             "--compile or --offload (the exact exchange reads its sizes on the host)")

    def _check_graphs(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(
                f"--graphs captures the training step with torch.cuda.graph and needs a CUDA device, "
                f"got --device {self.device}"
            )
        if self.experts_backend == "eager":
            raise ValueError(
                "--graphs: transformers' eager experts read the experts hit on the host (a sync that "
                "capture forbids); expected --experts-backend fuseops, grouped_mm or grouped_mm-autocast"
            )
        # grouped_mm-autocast hands grouped_mm bf16 weights under --dtype bfloat16, which compiled
        # grouped_mm takes; without autocast it is plain grouped_mm on the float32 weights.
        float32_grouped_mm = self.experts_backend == "grouped_mm" or (
            self.experts_backend == GROUPED_MM_AUTOCAST and self.dtype == "float32")
        if self.compile and float32_grouped_mm:
            raise ValueError(
                f"--graphs --compile: compiled, transformers' grouped_mm experts take a per-expert loop that "
                f"reads the group offsets on the host for float32 weights (a sync that capture forbids), and "
                f"--experts-backend {self.experts_backend} with --dtype {self.dtype} passes them float32 "
                f"weights; expected --experts-backend fuseops, grouped_mm-autocast with --dtype bfloat16, "
                f"or no --compile"
            )
        if self.offload:
            raise ValueError("--graphs with --offload: activation offloading is not captured in a graph; "
                             "expected one of the two")


@dataclass
class TrainResult:
    """What a run measured; ``val_losses`` holds ``(step, loss)`` pairs, ``offload_stats``
    the last step's ``offload.stats`` (empty without ``--offload``); ``tokens_per_s`` is per GPU
    (this rank's tokens; with expert parallelism every rank's are as many). ``peak_memory_bytes`` is
    the most allocated over the run (on a CPU: the process's peak resident set);
    ``peak_reserved_bytes`` the most the CUDA caching allocator reserved; the ``step_peak_*``
    the most one timed step allocated (reserved) above what was in use as it began
    (None off CUDA)."""

    config: TrainConfig
    losses: list[float]
    val_losses: list[tuple[int, float]]
    tokens_per_s: float
    peak_memory_bytes: int
    wall_s: float
    offload_stats: dict[str, int]
    peak_reserved_bytes: int | None = None
    step_peak_allocated_bytes: int | None = None
    step_peak_reserved_bytes: int | None = None

    @property
    def fell(self) -> bool:
        """Whether the smoothed training loss ended below where it started."""
        first, last = smoothed_ends(self.losses)
        return last < first

    def to_json(self) -> dict:
        first, last = smoothed_ends(self.losses)
        return {
            "config": dataclasses.asdict(self.config),
            "losses": self.losses,
            "val_losses": self.val_losses,
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "step_peak_allocated_bytes": self.step_peak_allocated_bytes,
            "step_peak_reserved_bytes": self.step_peak_reserved_bytes,
            "wall_s": self.wall_s,
            "offload_stats": self.offload_stats,
            "initial_smoothed_loss": first,
            "final_smoothed_loss": last,
            "final_val_loss": self.val_losses[-1][1] if self.val_losses else None,
            "loss_fell": self.fell,
        }


def head_dim(hidden: int) -> int:
    """Attention head size for a model width: 32 below 256, else 64."""
    return 32 if hidden < 256 else 64


def smoothing_window(steps: int) -> int:
    """How many steps a smoothed loss averages: a fifth of the run, 1 to 10."""
    return max(1, min(10, steps // 5))


def smoothed_ends(losses: Sequence[float]) -> tuple[float, float]:
    """Mean of the first and of the last ``smoothing_window`` losses."""
    window = smoothing_window(len(losses))
    return sum(losses[:window]) / window, sum(losses[-window:]) / window


@functools.cache
def stdlib_text(budget_bytes: int = DATA_BYTES) -> bytes:
    """The standard library's ``.py`` sources, cut at ``budget_bytes``.

    Files are read in a fixed order: each folder's files sorted by name, then its
    subfolders, sorted. Third-party packages (``site-packages``) and bytecode caches are
    left out, so the text depends on the Python version only.

    Args:
        budget_bytes: how many bytes to return.
    """
    root = os.path.dirname(os.__file__)
    chunks, size = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _NOT_STDLIB)
        for name in sorted(f for f in filenames if f.endswith(".py")):
            chunks.append(Path(dirpath, name).read_bytes())
            size += len(chunks[-1])
            if size >= budget_bytes:
                return b"".join(chunks)[:budget_bytes]
    raise RuntimeError(f"the standard library under {root} holds {size} bytes of .py, expected {budget_bytes}")


def split_tokens(text: bytes, val_fraction: float = VAL_FRACTION) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte tokens [N] (int64) split into a training head and a held-out tail.

    Args:
        text: the corpus.
        val_fraction: the share of it held out for validation.
    """
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]


def random_batches(
    tokens: torch.Tensor, batch: int, seq: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, targets), each [batch, seq], from windows at random offsets.

    Args:
        tokens: [N] token ids.
        batch: windows per batch.
        seq: tokens per window; the targets are the inputs shifted by one.
        seed: seeds the offsets, so that every backend sees the same batches.
    """
    generator = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(tokens) - seq - 1, (batch,), generator=generator)
        windows = torch.stack([tokens[s : s + seq + 1] for s in starts.tolist()])
        yield windows[:, :-1], windows[:, 1:]


def fixed_batches(tokens: torch.Tensor, batch: int, seq: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Up to ``count`` (inputs, targets) batches of consecutive windows from the start of ``tokens``."""
    usable = (len(tokens) - 1) // seq * seq
    windows = tokens[: usable + 1].unfold(0, seq + 1, seq)[: count * batch]
    return [(w[:, :-1], w[:, 1:]) for w in windows.split(batch) if len(w) == batch]


def grouped_mm_autocast_experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' ``grouped_mm`` experts with this module's weights cast to the autocast dtype for the
    call, as ``torch.autocast`` casts a Linear's (differentiably; outside autocast, plain ``grouped_mm``).
    It is the fair bf16 baseline: plain ``grouped_mm`` casts the tokens to the float32 master weights."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    device_type = hidden_states.device.type
    if not torch.is_autocast_enabled(device_type):
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    dtype = torch.get_autocast_dtype(device_type)
    # Autocast casts floating-point tensors other than float64; submodules' parameters (a post-expert
    # norm's) keep their dtype, as autocast leaves a norm's.
    cast = {name: p.to(dtype) for name, p in self.named_parameters(recurse=False)
            if p.is_floating_point() and p.dtype != torch.float64}
    with _reparametrize_module(self, cast):
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def build_model(cfg: TrainConfig) -> torch.nn.Module:
    """A randomly initialised ``Qwen3MoeForCausalLM`` (float32, on ``cfg.device``), its experts
    on ``cfg.experts_backend``; the weights depend on ``cfg.seed`` and the sizes only."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    heads = cfg.hidden // head_dim(cfg.hidden)
    config = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=head_dim(cfg.hidden),
        intermediate_size=4 * cfg.hidden,
        moe_intermediate_size=cfg.moe_intermediate or cfg.hidden,
        num_experts=cfg.experts,
        num_experts_per_tok=cfg.top_k,
        norm_topk_prob=True,
        max_position_embeddings=cfg.seq,
        use_cache=False,
    )
    torch.manual_seed(cfg.seed)
    model = Qwen3MoeForCausalLM(config).to(cfg.device)
    if cfg.experts_backend == "fuseops":
        fuseops.integrations.transformers.register()
    elif cfg.experts_backend == GROUPED_MM_AUTOCAST:
        from transformers.integrations.moe import ExpertsInterface

        ExpertsInterface.register(GROUPED_MM_AUTOCAST, grouped_mm_autocast_experts_forward)
    model.set_experts_implementation(cfg.experts_backend)
    return model


@contextlib.contextmanager
def forward_context(cfg: TrainConfig) -> Iterator[fuseops.offload.ActivationOffload | None]:
    """Where a forward runs: bf16 autocast, the quantization recipe, activation offloading
    (its handle is what the block yields; None without ``cfg.offload``)."""
    with contextlib.ExitStack() as stack:
        if cfg.dtype == "bfloat16":
            stack.enter_context(torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16))
        recipe = RECIPES[cfg.recipe]
        if recipe is not None:
            stack.enter_context(fuseops.autocast(recipe=recipe()))
        yield stack.enter_context(fuseops.offload_activations()) if cfg.offload else None


def lm_loss(model: Callable[..., object], inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross entropy, computed in float32.

    Args:
        model: the causal LM (or its compiled form).
        inputs: [B, S] token ids.
        targets: [B, S] the next token of each input.
    """
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_step(
    model: Callable[..., object], opt: torch.optim.Optimizer, cfg: TrainConfig, offload_stats: dict[str, int],
    after_backward: Callable[[], None] | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``step(inputs, targets) -> loss``: one AdamW step; with ``cfg.graphs``, eager for the
    first ``WARMUP_STEPS`` calls on a side stream, then one captured graph replayed.

    Args:
        model: the causal LM (or its compiled form).
        opt: the optimizer of its parameters.
        cfg: the run.
        offload_stats: where each step leaves its ``offload.stats`` (with ``cfg.offload``).
        after_backward: runs between the backward and the optimizer step.
    """

    def eager_step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with forward_context(cfg) as offload:
            loss = lm_loss(model, inputs, targets)
        loss.backward()
        if after_backward is not None:
            after_backward()
        opt.step()
        if offload is not None:
            offload_stats.update(offload.stats)
        return loss.detach()

    return CapturedStep(eager_step) if cfg.graphs else eager_step


class CapturedStep:
    """A training step captured whole in a CUDA graph on static input buffers.

    The first ``WARMUP_STEPS`` calls run eagerly on a side stream (as ``torch.cuda.graph``
    asks: lazily built state, such as AdamW's, must exist before capture); the next call
    captures the step and every call from then on copies its batch into the static
    buffers and replays the graph.
    """

    def __init__(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.step = step
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.side_stream = torch.cuda.Stream()

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= WARMUP_STEPS:
            self.side_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side_stream):
                loss = self.step(inputs, targets)
            torch.cuda.current_stream().wait_stream(self.side_stream)
            return loss
        if self.graph is None:
            self._capture(inputs, targets)
        static_inputs, static_targets, static_loss = self.static
        static_inputs.copy_(inputs)
        static_targets.copy_(targets)
        self.graph.replay()
        return static_loss.clone()

    def _capture(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        static_inputs, static_targets = inputs.clone(), targets.clone()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            static_loss = self.step(static_inputs, static_targets)
        self.static = (static_inputs, static_targets, static_loss)


@dataclass(frozen=True)
class Ranks:
    """Where this process runs: rank ``rank`` of ``world`` (1 without expert parallelism), on
    ``device``; ``group`` the expert-parallel (and data-parallel) group."""

    rank: int
    world: int
    device: torch.device
    group: dist.ProcessGroup | None = None

    @classmethod
    def start(cls, cfg: TrainConfig) -> Ranks:
        """With ``--expert-parallel P``: joins torchrun's P ranks (NCCL on CUDA, gloo on the CPU)."""
        device = torch.device(cfg.device)
        if cfg.expert_parallel == 1:
            return cls(0, 1, device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != cfg.expert_parallel:
            raise SystemExit(f"--expert-parallel {cfg.expert_parallel}: expected a launch of as many ranks "
                             f"(torchrun --nproc-per-node {cfg.expert_parallel}), got world size {world}")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), world, device, dist.group.WORLD)

    def local(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's share of a global batch [B, ...]: rows [r * B/P, (r + 1) * B/P)."""
        share = batch.shape[0] // self.world
        return batch[self.rank * share:(self.rank + 1) * share]

    def mean(self, value: torch.Tensor) -> float:
        """The mean over the ranks of a 0-d tensor (every rank's share has as many tokens)."""
        if self.world > 1:
            value = value.detach().clone()
            dist.all_reduce(value)
            value /= self.world
        return value.item()


@torch.no_grad()
def evaluate(model: Callable[..., object], batches: list[tuple[torch.Tensor, torch.Tensor]], cfg: TrainConfig,
             ranks: Ranks | None = None) -> float:
    """Mean loss over the held-out batches (same autocast and recipe as training, no offload); with
    ``ranks``, each rank its share of every batch."""
    ranks = ranks or Ranks(0, 1, torch.device(cfg.device))
    eval_cfg = dataclasses.replace(cfg, offload=False, graphs=False)
    total = 0.0
    for inputs, targets in batches:
        with forward_context(eval_cfg):
            loss = lm_loss(model, ranks.local(inputs).to(ranks.device), ranks.local(targets).to(ranks.device))
        total += ranks.mean(loss)
    return total / len(batches)


class MemoryMeter:
    """A run's memory: on CUDA the peaks allocated and reserved over the whole run, and the most
    one measured step allocated (reserved) above what was in use as it began without gradient
    buffers (the weights and AdamW's state): the step's gradients count inside it, as a first
    step's do, although ``zero_grad`` frees the previous step's only inside the step. On a CPU
    only the process's peak resident set."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.peak_allocated = self.peak_reserved = self.step_allocated = self.step_reserved = 0
        self.start = (0, 0)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def step_begins(self, held_gradient_bytes: int = 0) -> None:
        """Folds the peaks so far into the run's, then measures from here, less the gradient
        buffers still held from the previous step."""
        if self.cuda:
            self.peaks()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = (torch.cuda.memory_allocated(self.device) - held_gradient_bytes,
                          torch.cuda.memory_reserved(self.device))

    def step_ends(self) -> None:
        """After the step's work has finished (the loss was read back)."""
        if self.cuda:
            self.step_allocated = max(self.step_allocated, torch.cuda.max_memory_allocated(self.device) - self.start[0])
            self.step_reserved = max(self.step_reserved, torch.cuda.max_memory_reserved(self.device) - self.start[1])

    def peaks(self) -> tuple[int, int | None]:
        """The most allocated and reserved so far (CPU: the peak resident set, None)."""
        if not self.cuda:
            # ru_maxrss is in KiB on Linux, bytes on macOS.
            scale = 1 if sys.platform == "darwin" else 1024
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, None
        self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated(self.device))
        self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved(self.device))
        return self.peak_allocated, self.peak_reserved


def train(
    cfg: TrainConfig, *, progress: bool = True, on_step: Callable[[int, float, float], None] | None = None
) -> TrainResult:
    """Train a fresh model for ``cfg.steps`` AdamW steps on the standard library's text.

    Args:
        cfg: the run.
        progress: show progress with loss, tokens/s and memory (a tqdm bar where tqdm is
            installed, else a line every tenth of the steps).
        on_step: called after each step with its number (from 1), its loss and its seconds
            (forward, backward and AdamW, to the loss read back).
    """
    ranks = Ranks.start(cfg)
    device = ranks.device
    memory = MemoryMeter(device)
    train_tokens, val_tokens = split_tokens(stdlib_text(cfg.data_bytes))
    val_batches = fixed_batches(val_tokens, cfg.batch, cfg.seq, EVAL_BATCHES)
    # Every rank builds the whole model from the same seed, then keeps its experts.
    model = build_model(dataclasses.replace(cfg, device=str(device)))
    after_backward = None
    runnable: Callable[..., object] = model
    if ranks.world > 1:
        experts = ep.shard_experts(model, ranks.group, cfg.ep_pieces or None)
        ep.ignore_in_ddp(model, experts)
        runnable = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda"
                                                             else None)
        after_backward = functools.partial(ep.scale_expert_grads, experts, ranks.group)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, capturable=cfg.graphs)
    runnable = torch.compile(runnable) if cfg.compile else runnable
    offload_stats: dict[str, int] = {}
    step = make_step(runnable, opt, cfg, offload_stats, after_backward)
    # The same global batches on every rank (one seed); each rank trains on its share.
    batches = random_batches(train_tokens, cfg.batch, cfg.seq, cfg.seed)

    losses: list[float] = []
    val_losses: list[tuple[int, float]] = []
    timed_s, timed_tokens = 0.0, 0
    start = time.perf_counter()
    bar = progress_bar(cfg, progress and ranks.rank == 0)
    for i in range(1, cfg.steps + 1):
        inputs, targets = (ranks.local(t).to(device, non_blocking=True) for t in next(batches))
        timed = i > UNTIMED_STEPS or cfg.steps <= UNTIMED_STEPS
        memory.step_begins(gradient_bytes(model))
        t0 = time.perf_counter()
        # The loss of the global batch: the mean of the ranks' (equal shares).
        losses.append(ranks.mean(step(inputs, targets)))
        dt = time.perf_counter() - t0
        if timed:
            memory.step_ends()
            timed_s, timed_tokens = timed_s + dt, timed_tokens + inputs.numel()
        if on_step is not None:
            on_step(i, losses[-1], dt)
        if cfg.eval_every and (i % cfg.eval_every == 0 or i == cfg.steps):
            val_losses.append((i, evaluate(runnable, val_batches, cfg, ranks)))
        bar(i, loss=f"{losses[-1]:.3f}", tok_s=f"{inputs.numel() / dt:,.0f}",
            mem=f"{memory.peaks()[0] / 2**20:,.0f}MiB")
    peak_allocated, peak_reserved = memory.peaks()
    step_peaks = (memory.step_allocated, memory.step_reserved) if memory.cuda else (None, None)
    return TrainResult(cfg, losses, val_losses, timed_tokens / max(timed_s, 1e-9), peak_allocated,
                       time.perf_counter() - start, offload_stats, peak_reserved, *step_peaks)


def progress_bar(cfg: TrainConfig, show: bool) -> Callable[..., None]:
    """``bar(step, **values)`` after each step: a tqdm bar where tqdm is installed (the ``bench``
    extra), else a printed line every tenth of the steps; nothing when ``show`` is False."""
    if not show:
        return lambda step, **values: None
    try:
        from tqdm import tqdm
    except ImportError:
        every = max(cfg.steps // 10, 1)

        def line(step: int, **values: str) -> None:
            if step % every == 0 or step == cfg.steps:
                print(f"{cfg.experts_backend} step {step}/{cfg.steps} "
                      + " ".join(f"{k}={v}" for k, v in values.items()), flush=True)
        return line
    bar = tqdm(total=cfg.steps, desc=cfg.experts_backend, unit="step")

    def update(step: int, **values: str) -> None:
        bar.update(1)
        bar.set_postfix(**values)
        if step == cfg.steps:
            bar.close()
    return update


def gradient_bytes(model: torch.nn.Module) -> int:
    """The bytes of the gradient buffers the parameters hold (none before the first step)."""
    return sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)


def plot(result: TrainResult, path: Path) -> bool:
    """Training loss (raw and smoothed) and validation loss against the step, as a PNG; False
    (nothing written) where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = result.losses
    steps = range(1, len(losses) + 1)
    window = smoothing_window(len(losses))
    smooth = [sum(losses[max(0, i - window + 1) : i + 1]) / min(window, i + 1) for i in range(len(losses))]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, losses, alpha=0.3, color="C0", label="train")
    ax.plot(steps, smooth, color="C0", label=f"train (mean of {window})")
    if result.val_losses:
        ax.plot(*zip(*result.val_losses), marker="o", color="C1", label="validation")
    ax.axhline(math.log(256), color="grey", linestyle=":", label="uniform over bytes")
    cfg = result.config
    ax.set_title(f"Qwen3-MoE bytes, {cfg.layers}x{cfg.hidden}, {cfg.experts} experts top-{cfg.top_k}, "
                 f"{cfg.experts_backend}, {cfg.dtype}, recipe {cfg.recipe}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross entropy (nats per byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def parse_args(argv: Sequence[str] | None = None) -> tuple[TrainConfig, Path, list[Path]]:
    """The command line as a ``TrainConfig`` and the results folder; an invalid value or
    combination exits with the reason (code 2)."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=defaults.steps, help="AdamW steps")
    parser.add_argument("--device", default=defaults.device, help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=DTYPES, default=defaults.dtype,
                        help="bfloat16: float32 weights, forward under torch.autocast")
    for name in ("layers", "hidden", "experts", "top-k", "seq", "batch"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name.replace("-", "_")))
    parser.add_argument("--moe-intermediate", type=int, default=defaults.moe_intermediate,
                        help="the experts' FFN width (default: --hidden)")
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--recipe", choices=RECIPES, default=defaults.recipe,
                        help="quantize the experts' GEMMs (fuseops backend only)")
    parser.add_argument("--experts-backend", choices=BACKENDS, default=defaults.experts_backend)
    parser.add_argument("--offload", action="store_true", help="offload saved activations to the host")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--graphs", action="store_true", help="capture the training step in a CUDA graph")
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every,
                        help="validation loss every N steps and at the end (0: never)")
    parser.add_argument("--data-bytes", type=int, default=defaults.data_bytes,
                        help="bytes of standard-library text; the last tenth is held out")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seeds the weights and the batches")
    parser.add_argument("--expert-parallel", type=int, default=defaults.expert_parallel,
                        help="shard the experts over this many ranks (launch that many with torchrun)")
    parser.add_argument("--ep-pieces", type=int, default=defaults.ep_pieces,
                        help="expert parallelism: the remote rows in this many pieces beside the experts (0: one "
                             "exchange)")
    parser.add_argument("--out", help="folder for train_moe_lm.json and train_moe_lm.png "
                                      "(default: a new folder under the system's temporary folder)")
    parser.add_argument("--compare-to", type=Path, nargs="*", default=[],
                        help="earlier runs' train_moe_lm.json: their loss curves against this one's and each other's")
    args = parser.parse_args(argv)
    out, compare_to = args.__dict__.pop("out"), args.__dict__.pop("compare_to")
    try:
        cfg = TrainConfig(**vars(args))
    except ValueError as e:
        parser.error(str(e))
    return cfg, Path(out) if out is not None else None, compare_to


def compare_losses(losses: Sequence[float], runs: Sequence[Path]) -> list[str]:
    """Lines saying how far this run's loss curve is from each earlier run's, and those runs'
    from each other (two runs of the same batches on two correct implementations: the floor
    that rounding sets), as the mean and the largest |difference| over the common steps."""
    curves = {"this run": list(losses)}
    for path in runs:
        curves[str(path)] = json.loads(path.read_text())["losses"]

    def gap(a: list[float], b: list[float]) -> str:
        d = [abs(x - y) for x, y in zip(a, b)]
        mean = sum(d) / max(len(d), 1)
        return f"mean |loss difference| {mean:.2e}, max {max(d, default=0.0):.2e} over {len(d)} steps"

    names = list(curves)
    return [f"{a} vs {b}: {gap(curves[a], curves[b])}" for i, a in enumerate(names) for b in names[i + 1:]]


def main(argv: Sequence[str] | None = None) -> int:
    """Train, write the JSON and PNG, print ``OK:`` or ``FAIL:``; returns the exit code (with
    expert parallelism, rank 0 writes and prints)."""
    cfg, out, compare_to = parse_args(argv)
    result = train(cfg)
    if dist.is_initialized():
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank > 0:
            return 0 if result.fell else 1
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="train_moe_lm-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_moe_lm.json").write_text(json.dumps(result.to_json(), indent=1))
    if plot(result, out / "train_moe_lm.png"):
        print(f"wrote {out / 'train_moe_lm.json'} and {out / 'train_moe_lm.png'}")
    else:
        print(f"wrote {out / 'train_moe_lm.json'} (no plot: matplotlib is not installed; "
              "pip install -e '.[bench]' adds it)")
    summary = result.to_json()
    val = summary["final_val_loss"]
    gpus = f" per GPU over {cfg.expert_parallel} ranks" if cfg.expert_parallel > 1 else ""
    print(f"{cfg.steps} steps in {result.wall_s:.1f} s, {result.tokens_per_s:,.0f} tokens/s{gpus}, "
          f"peak memory {result.peak_memory_bytes / 2**20:,.0f} MiB")
    if result.offload_stats:
        print(f"offload, last step: {result.offload_stats['bytes_offloaded'] / 2**20:,.1f} MiB in "
              f"{result.offload_stats['tensors_offloaded']} saved tensors went to the host and back")
    for line in compare_losses(result.losses, compare_to):
        print(line)
    verdict = "OK" if result.fell else "FAIL"
    print(f"{verdict}: smoothed train loss {summary['initial_smoothed_loss']:.4f} -> "
          f"{summary['final_smoothed_loss']:.4f}, final val loss "
          + (f"{val:.4f}" if val is not None else "not measured"))
    return 0 if result.fell else 1


if __name__ == "__main__":
    sys.exit(main())
