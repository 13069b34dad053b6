"""Session 20 (issue 20): Dynamo's guards on a compiled fuseops model against torch.compile of the
same torch model, on CPU. Per model: frames compiled, leaf guards and guard-tree lines per frame,
the time of one guard check (the frame's guard manager run on the frame's locals, median of many),
and the leaf guards grouped by where their source lies (module tree, fuser, dispatch, ...).
    python benchmarks/results/session20/guard_count.py [--backend aot_eager|inductor] [--top N]
    python benchmarks/results/session20/guard_count.py --dump dense   # the whole guard tree
    FUSEOPS_ROOT=build/base python benchmarks/results/session20/guard_count.py   # another tree's fuseops
Reads Dynamo's cache entries (``torch._dynamo.eval_frame._debug_get_cache_entry_list``) and the
guard manager's printed tree (the lines ``torch._logging`` ``guards`` prints), present on 2.11-2.13.
"""
import argparse
import gc
import inspect
import os
import re
import sys
import time
import types
from collections import Counter

import torch
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

sys.path.insert(0, ".")
# FUSEOPS_ROOT: a directory holding another version's ``fuseops`` package (an A/B on one machine).
sys.path.insert(0, os.environ.get("FUSEOPS_ROOT", "."))
import fuseops
import fuseops.compiled_sequential
from benchmarks.sizes import FuseopsMoE, TorchMoE, fuseops_dense, routing, torch_dense

# The two operators, as a GPU runs them (session 63: on the CPU a compiled Sequential is traced op by op).
fuseops.compiled_sequential.OPERATORS_ON_CPU = True

_MANAGER = re.compile(r"\+- (?:\w*GuardManager|KeyManager|ValueManager|KeyValueManager)")
_SOURCE = re.compile(r"source=(.*?), (?:accessed_by|type)=")


def guard_lines(tree: str) -> list[tuple[str, str]]:
    """``(source of the enclosing manager, guard kind)`` per leaf guard of a printed tree."""
    stack: list[tuple[int, str]] = []
    out = []
    for line in tree.splitlines():
        at = line.find("+- ")
        if at < 0:
            continue
        while stack and stack[-1][0] >= at:
            stack.pop()
        if _MANAGER.match(line, at):
            m = _SOURCE.search(line)
            stack.append((at, m.group(1) if m else (stack[-1][1] if stack else "root")))
        else:
            kind = line[at + 3:].split(":", 1)[0]
            out.append((stack[-1][1] if stack else "root", kind))
    return out


def category(source: str) -> str:
    """Where a guarded value lives, coarsely: the issue's breakdown."""
    # ``L['fn']``: the module, when Dynamo wraps a module it inlines (torch.nn.Sequential).
    if re.match(r"(list\(dict\.keys\()?L\['(self|fn)'\]", source):
        if "_parameters" in source:
            return "module tree: parameters"
        if re.search(r"\]\.(training|fuse)$", source):
            return "module tree: training/fuse flags"
        if source.endswith(("__dict__", "_modules", "_buffers")):
            return "module tree: dicts (attribute absent, keys)"
        if re.search(r"\._modules\['\w+'\]$", source) or source.startswith("list(dict.keys"):
            return "module tree: submodules (type, key)"
        return "module tree: op attributes"
    if source.startswith("L["):
        return "inputs"
    if "build_plan" in source or "REGISTRY" in source or "fusions_dot_fusion" in source:
        return "fuser: REGISTRY fusions"
    if "dispatch" in source or "_TRACED" in source:
        return "dispatch tables"
    if "__code__" in source or "__defaults__" in source or "__kwdefaults__" in source:
        return "globals: functions"
    if source.startswith(("G[", "dict(", "type(")):
        return "globals: other"
    return "global state (grad mode, autocast, ...)"


def compiled_frames() -> list:
    """``(function, cache entries)`` of every code object Dynamo holds compiled entries for (the
    module's ``forward``, or the wrapper Dynamo puts around a module it inlines)."""
    out = []
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType:
            try:
                entries = _debug_get_cache_entry_list(obj.__code__)
            except ReferenceError:
                continue
            if entries and all(obj.__code__ is not f.__code__ for f, _ in out):
                out.append((obj, entries))
    return out


def frame_locals(fn, model, args) -> dict:
    """The locals a call of ``fn`` starts with: ``(self, *args)``, or ``(*args, **kwargs)`` and
    its closure (Dynamo's wrapper of an inlined module)."""
    code = fn.__code__
    if code.co_argcount == 0 and code.co_flags & inspect.CO_VARARGS:
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        return {code.co_varnames[0]: args, code.co_varnames[1]: {}, **cells}
    return dict(zip(code.co_varnames[: code.co_argcount], (model, *args)))


def check_us(manager, f_locals, reps: int = 5000) -> float:
    """Fastest microseconds of one guard check, over ``reps`` checks in blocks of 100 (the
    fastest block: this machine's other load only ever adds)."""
    assert manager.check(f_locals), "the guards fail on the frame's own locals"
    times = []
    for _ in range(reps // 100):
        t = time.perf_counter()
        for _ in range(100):
            manager.check(f_locals)
        times.append((time.perf_counter() - t) / 100 * 1e6)
    return min(times)


def models():
    torch.manual_seed(0)
    dense = fuseops_dense(32, "gelu")
    x = torch.randn(16, 32, requires_grad=True)
    yield "fuseops dense", dense, (x,)
    yield "torch dense", torch_dense(dense), (x,)
    # bf16: torch._grouped_mm (the torch MoE) takes only bf16 operands.
    moe = FuseopsMoE(4, 32, 48).bfloat16()
    ids, weights = routing(16, 4, 2, False, "cpu")
    moe_args = (x.detach().bfloat16().requires_grad_(), ids, weights.bfloat16().requires_grad_())
    yield "fuseops moe", moe, moe_args
    yield "torch moe", TorchMoE(moe), moe_args


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--top", type=int, default=0, help="also print the N sources with most guards")
    parser.add_argument("--dump", help="print the whole guard tree of the model whose name contains this")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, backend {args.backend}, fuseops from {fuseops.__file__}")
    for name, model, inputs in models():
        torch._dynamo.reset()
        counters = torch._dynamo.utils.counters
        counters.clear()
        compiled = torch.compile(model, backend=args.backend)
        for _ in range(2):
            for p in model.parameters():
                p.grad = None
            compiled(*inputs).sum().backward()
        frames = compiled_frames()
        breaks = sum(counters["graph_break"].values())
        print(f"{name:14} frames {sum(len(e) for _, e in frames)} graphs {counters['stats']['unique_graphs']} "
              f"breaks {breaks}")
        for fn, e in ((f, e) for f, entries in frames for e in entries):
            tree = str(e.guard_manager)
            leaves = guard_lines(tree)
            us = check_us(e.guard_manager, frame_locals(fn, model, inputs))
            print(f"   leaf guards {len(leaves):5d}  tree lines {len(tree.splitlines()):5d}  check {us:6.1f} us")
            by_cat = Counter(category(s) for s, _ in leaves)
            for cat, n in by_cat.most_common():
                print(f"      {n:5d}  {cat}")
            if args.top:
                for src, n in Counter(s for s, _ in leaves).most_common(args.top):
                    print(f"      {n:5d}  {src[:150]}")
            if args.dump and args.dump in name:
                print(tree)


if __name__ == "__main__":
    main()
