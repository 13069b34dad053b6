"""Session 46 probe: does the caching allocator's history record a CUDA-graph capture's allocations
(into a shared pool), with the capturing stream, so that a graph's write set can be read from it?"""
import time

import torch

dev = torch.device("cuda")
pool = torch.cuda.graph_pool_handle()
side = torch.cuda.Stream()
flag = torch.zeros(1, device=dev)
# (asked before CUDA is initialised, _cuda_isHistoryEnabled segfaults on torch 2.11)
print("torch", torch.__version__, "history on:", torch._C._cuda_isHistoryEnabled())
sentinel = torch.cuda.CUDAGraph()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    sentinel.capture_begin(pool=pool, capture_error_mode="thread_local")
    flag.zero_()
    sentinel.capture_end()
torch.cuda.current_stream().wait_stream(side)
x = torch.randn(512, 512, device=dev)
w = torch.randn(512, 512, device=dev)


def body(a):
    t = torch.relu(a @ w)  # transient
    u = t * 2  # transient
    return (u @ w).sum(0)


def capture(fn, arg):
    g = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(arg)
        t0 = time.perf_counter()
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python", clear_history=True)
        t1 = time.perf_counter()
        g.capture_begin(pool=pool, capture_error_mode="thread_local")
        out = fn(arg)
        g.capture_end()
        t2 = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        t3 = time.perf_counter()
        torch.cuda.memory._record_memory_history(None)
    torch.cuda.current_stream().wait_stream(side)
    trace = snap["device_traces"][dev.index or 0]
    print(f"  enable {1e3*(t1-t0):.2f} ms, capture {1e3*(t2-t1):.2f} ms, snapshot {1e3*(t3-t2):.2f} ms, "
          f"{len(trace)} events, keys {sorted(trace[0]) if trace else None}")
    allocs = [(e["addr"], e["size"], e["stream"]) for e in trace if e["action"] == "alloc"]
    print("  actions:", sorted({e["action"] for e in trace}))
    print("  allocs:", [(hex(a), s, st == side.cuda_stream) for a, s, st in allocs])
    return g, out, allocs


g1, r1, w1 = capture(body, x)
print("r1 at", hex(r1.data_ptr()), r1.untyped_storage().nbytes())
g2, r2, w2 = capture(lambda a: body(a) + 1, x)
print("r2 at", hex(r2.data_ptr()))
over = [(hex(a), s) for a, s, _ in w1 if a < r2.data_ptr() + r2.untyped_storage().nbytes() and r2.data_ptr() < a + s]
print("r2 overlaps W(g1):", over)
g1.replay(); g2.replay(); torch.cuda.synchronize()
print("replays ok; history on after:", torch._C._cuda_isHistoryEnabled())
