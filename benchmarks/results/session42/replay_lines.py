"""Session 42 probe (issue 20): where an eager replay's host time goes, line by line, at GPU-bound dense cells
(session 41: the recorded programs run without graphs there and a drained step issues in 3.23 ms against torch
eager's 2.81 at GELU T=16384 H=4096). Each recorded program's source is compiled again with a clock read after
every line; drained steps then report: the step's issue time (plain, then instrumented), the programs' share,
and the costliest lines by kind (the first call of each line: launch, aten op, descriptor, weight cache).

    python benchmarks/results/session42/replay_lines.py [--cells gelu:16384:4096 ...] [--steps 20]
"""
import argparse
import collections
import re
import time

import torch

from benchmarks.sizes import dense_cell, step_fn
from fuseops.ops.executor import graphed, replay


def instrumented(program: replay.Program, acc: dict) -> None:
    """Replace ``program``'s eager run by one that adds each line's host seconds into ``acc[(id, i)]``."""
    lines = program.source.splitlines()
    out = [lines[0], "    _t = _pc()"]
    for i, line in enumerate(lines[1:], 1):
        if line.strip().startswith("return"):
            out.append(line)
            continue
        out.append(line)
        out.append(f"    _n = _pc(); _acc[{(id(program), i)!r}] += _n - _t; _t = _n")
    namespace = dict(program.run.__globals__)
    namespace.update(_pc=time.perf_counter, _acc=acc)
    exec(compile("\n".join(out) + "\n", "<instrumented>", "exec"), namespace)
    run = namespace["program"]
    for i, line in enumerate(lines[1:], 1):
        acc.setdefault((id(program), i), 0.0)
        acc.setdefault(("text", id(program), i), line.strip())
    program.run = run
    if program.graph is not None:
        program.graph.eager_run = run


def kind(line: str) -> str:
    if "data_ptr()" in line and "stream(" in line:
        return "direct launch" + (" +descriptors" if "base=" in line else "")
    if line.startswith("launch(") or "= launch(" in line:
        return "launch()"
    m = re.search(r"#\s*(\S+)$", line)
    if m:
        return ".".join(m.group(1).split(".")[:2])
    if "derived" in line:
        return "weight cache"
    return "other"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "gelu:4096:2048", "swiglu:4096:2048"])
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell, device="cuda" if torch.cuda.is_available() else "cpu")
        rows = {}
        for name, m in (("torch", reference), ("fuseops", model)):
            step = step_fn(m, (x,), list(m.parameters()))
            for _ in range(60):
                step()

            def drained():
                walls = []
                for _ in range(a.steps):
                    sync()
                    t = time.perf_counter()
                    step()
                    walls.append(1e3 * (time.perf_counter() - t))
                sync()
                return sorted(walls)[len(walls) // 2]
            rows[name] = drained()
            if name == "fuseops":
                # The programs, wherever the Prepared runs keep them: found through replay.replayed.
                seen = {}
                real = replay.replayed

                def spy(program, *inputs, notice=None):
                    seen[id(program)] = program
                    return real(program, *inputs, notice=notice)
                replay.replayed = spy
                step()
                sync()
                replay.replayed = real
                acc = {}
                phases = collections.Counter(str(prog.graph.phase) if prog.graph else "no graph" for prog in seen.values())
                for prog in seen.values():
                    instrumented(prog, acc)
                inst = drained()
                for k in list(acc):
                    if k[0] != "text":
                        acc[k] = 0.0
                drained()
                total = sum(v for k, v in acc.items() if k[0] != "text") / a.steps * 1e6
                by_kind = collections.defaultdict(lambda: [0, 0.0])
                for k, v in acc.items():
                    if k[0] == "text":
                        continue
                    kd = kind(acc[("text", *k)])
                    by_kind[kd][0] += 1
                    by_kind[kd][1] += v / a.steps * 1e6
                print(f"\n== {cell}: drained issue torch {rows['torch']:.2f} ms, fuseops {rows['fuseops']:.2f} ms "
                      f"(instrumented {inst:.2f}); {len(seen)} programs ({dict(phases)}), their lines {total:.0f} us a step")
                for kd, (count, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
                    print(f"   {us:8.1f} us a step  {count:4d} lines  {us / max(count, 1):6.1f} us a line  {kd}")
                top = sorted(((v, k) for k, v in acc.items() if k[0] != "text"), reverse=True)[:12]
                for v, k in top:
                    print(f"   {v / a.steps * 1e6:7.1f} us  {acc[('text', *k)][:150]}")
            del step
        del model, reference, x


if __name__ == "__main__":
    main()
