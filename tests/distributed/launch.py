"""Run checks on P ranks: processes on gloo (CPU) or NCCL (one GPU each), or the ranks of
a ``torchrun`` launch. A check is a module-level function ``check(device, dtypes, report)``
run on every rank with the default group initialised; it compares the distributed
results with the single-process model through ``report``.

The test suite keeps one pool of rank processes per world size for the whole session:
starting a process (importing torch and triton) costs seconds on a CI core, a check
costs milliseconds. CPU ranks fork from a server process that imported them once.
"""

from __future__ import annotations

import datetime
import queue
import socket
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import REL_TOL, rel_err

# A rank that fails while the others wait in a collective turns into an error, not a
# hang. On GPUs a peer may spend minutes compiling Triton kernels before its collective.
COLLECTIVE_TIMEOUT_S = {"cpu": 60, "cuda": 600}
CHECK_TIMEOUT_S = {"cpu": 120.0, "cuda": 900.0}


@dataclass
class Report:
    """Asserts closeness and records the worst relative error per (what, dtype)."""

    rows: dict[tuple[str, str], float] = field(default_factory=dict)

    def close(self, out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str, factor: float = 1.0) -> None:
        assert out is not None, f"{what}: missing (None)"
        assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
        assert torch.isfinite(out).all(), f"{what}: non-finite values"
        err = rel_err(out.detach().cpu(), ref.detach().cpu())
        tol = REL_TOL[dtype] * factor
        assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e} ({dtype}, rank {dist.get_rank()})"
        key = (what, str(dtype).removeprefix("torch."))
        self.rows[key] = max(err, self.rows.get(key, 0.0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_rank(device_type: str, rank: int, local_rank: int, world_size: int, init_method: str) -> torch.device:
    """Initialise the default group (NCCL on one GPU per rank, gloo on CPU)."""
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        # The ranks share the machine's cores.
        torch.set_num_threads(1)
        device = torch.device("cpu")
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S[device_type]),
    )
    return device


def _serve(rank: int, world_size: int, port: int, device_type: str, tasks, results) -> None:
    device = init_rank(device_type, rank, rank, world_size, f"tcp://127.0.0.1:{port}")
    try:
        while (task := tasks.get()) is not None:
            check, dtypes = task
            try:
                check(device, tuple(dtypes), Report())
                results.put((rank, None))
            except BaseException:
                results.put((rank, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    """``world_size`` processes, each one rank of a default group, running checks."""

    def __init__(self, world_size: int, device_type: str = "cpu") -> None:
        ctx = mp.get_context(_START_METHOD[device_type])
        if device_type == "cpu":
            # One server process imports torch and fuseops; the ranks fork from it.
            ctx.set_forkserver_preload(["tests.distributed.launch"])
        self.world_size = world_size
        self.timeout = CHECK_TIMEOUT_S[device_type]
        self.tasks = [ctx.SimpleQueue() for _ in range(world_size)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [
            ctx.Process(target=_serve, args=(r, world_size, port, device_type, self.tasks[r], self.results), daemon=True)
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def run(self, check: Callable, dtypes: Sequence[torch.dtype]) -> list[str]:
        """Run ``check`` on every rank; the tracebacks of the ranks that failed."""
        for q in self.tasks:
            q.put((check, tuple(dtypes)))
        failures = []
        for _ in range(self.world_size):
            try:
                rank, error = self.results.get(timeout=self.timeout)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                return failures + [f"no answer within {self.timeout} s (ranks exited: {dead})"]
            if error is not None:
                failures.append(f"rank {rank}:\n{error}")
        return failures

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.join()


# GPU ranks start fresh (spawn): a process forked after CUDA was initialised cannot use it.
_START_METHOD = {"cpu": "forkserver", "cuda": "spawn"}

_POOLS: dict[tuple[int, str], RankPool] = {}


def run_on_ranks(check: Callable, world_size: int, dtypes: Sequence[torch.dtype], device_type: str = "cpu") -> None:
    """Run ``check`` on ``world_size`` ranks (a pool kept for the session); raises
    AssertionError with every failing rank's traceback."""
    key = (world_size, device_type)
    pool = _POOLS.get(key) or _POOLS.setdefault(key, RankPool(world_size, device_type))
    failures = pool.run(check, dtypes)
    if failures:
        # After a failure the ranks may disagree about which collective comes next.
        _POOLS.pop(key).close()
        raise AssertionError(f"{check.__name__} failed on {world_size} ranks:\n" + "\n".join(failures))
