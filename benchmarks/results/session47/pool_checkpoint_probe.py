"""Session 47 probe (issue 20, the memory lever left: graphs' dead results reused by later captures). On torch 2.11's
caching allocator, what the scheme needs of the pool checkpoint API that torch's CUDA-graph trees use:

1. A graph's result handed out over a storage that does not own its block (``_construct_storage_from_data_pointer``),
   the owning result dropped after ``_cuda_getCheckpointState`` (the block is free in the allocator's eyes).
2. Before the next capture, ``_cuda_setCheckpointPoolState(device, state, [], [])`` restores the checkpoint: every
   result allocated again, owned by nobody; the live ones stay so (the capture cannot place anything over them), the
   dead ones are given back with ``_cuda_cudaCachingAllocator_raw_delete`` (the capture may reuse them).
3. Replays keep every live result's values; the pool's allocated bytes follow.

Prints each check's outcome and the restore's host time.

    python benchmarks/results/session47/pool_checkpoint_probe.py
"""
import time

import torch

dev = torch.device("cuda", 0)
pool = torch.cuda.graph_pool_handle()
side = torch.cuda.Stream()
N = 1 << 20
x = torch.randn(N, device=dev)


def capture(fn):
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        graph.capture_begin(pool=pool)
        out = fn()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return graph, out


def unowned(t):
    """``t``'s values over a storage that does not own the block, and its (start, end)."""
    nbytes = t.untyped_storage().nbytes()
    storage = torch._C._construct_storage_from_data_pointer(t.data_ptr(), dev, nbytes)
    view = torch.empty(0, device=dev, dtype=t.dtype).set_(storage, 0, t.shape, t.stride())
    return view, (t.data_ptr(), t.data_ptr() + nbytes)


def restore(state, dead):
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch._C._cuda_setCheckpointPoolState(dev.index, state, [], [])
    for ptr in dead:
        torch._C._cuda_cudaCachingAllocator_raw_delete(ptr)
    return (time.perf_counter() - start) * 1e3


def meets(a, b):
    return a[0] < b[1] and b[0] < a[1]


def mb():
    return torch.cuda.memory_allocated(dev) / 2**20


print(f"torch {torch.__version__}; allocated at start {mb():.1f} MB")
gA, yA = capture(lambda: (x * 2) + 1)
stateA = torch._C._cuda_getCheckpointState(dev.index, pool)
tA, spanA = unowned(yA)
del yA
print(f"A captured, its result handed out unowned: allocated {mb():.1f} MB")
# 1. A's result alive: the restore keeps it allocated, B's capture goes elsewhere.
ms = restore(stateA, [])
print(f"restore (A's result alive) {ms:.3f} ms: allocated {mb():.1f} MB")
gB, yB = capture(lambda: (x * 3) - 1)
stateB = torch._C._cuda_getCheckpointState(dev.index, pool)
tB, spanB = unowned(yB)
del yB
print(f"B's result meets A's live result: {meets(spanA, spanB)} (want False)")
gA.replay()
gB.replay()
torch.cuda.synchronize()
print(f"replays: A right {torch.equal(tA, x * 2 + 1)}, B right {torch.equal(tB, x * 3 - 1)}")
# 2. A's result dead, B's alive: A's block given back, C's capture may take it.
del tA
ms = restore(stateB, [spanA[0]])
print(f"restore (A dead, B alive) {ms:.3f} ms: allocated {mb():.1f} MB")
gC, yC = capture(lambda: (x * 4) + 2)
tC, spanC = unowned(yC)
del yC
print(f"C's result on A's dead block: {meets(spanA, spanC)} (reuse expected), on B's live one: "
      f"{meets(spanB, spanC)} (want False)")
gC.replay()
torch.cuda.synchronize()
print(f"C right {torch.equal(tC, x * 4 + 2)}, B still right {torch.equal(tB, x * 3 - 1)}")
# 3. A second restore with an unowned live block in the pool (B's), then everything dead and given back.
stateC = torch._C._cuda_getCheckpointState(dev.index, pool)
ms = restore(stateC, [])
print(f"restore again (B, C alive) {ms:.3f} ms: allocated {mb():.1f} MB; B right {torch.equal(tB, x * 3 - 1)}")
del tB, tC
ms = restore(stateC, [spanB[0], spanC[0]])
print(f"restore (all dead, given back) {ms:.3f} ms: allocated {mb():.1f} MB")
del gA, gB, gC
torch.cuda.synchronize()
torch.cuda.empty_cache()
print(f"graphs freed, cache emptied: allocated {mb():.1f} MB, reserved {torch.cuda.memory_reserved(dev) / 2**20:.1f} MB")
