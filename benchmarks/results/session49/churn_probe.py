"""Session 49 probe: why a fresh process under FUSEOPS_CUDA_GRAPHS=all captures GPU-bound programs again and again
(run 8, round 2: GELU T=4096 H=4096 first in its process, 20 captures of 8 programs, 6 dropped, 7 captured again,
1.64x the default rule's peak reserved memory; round 1, the same cell after torch's: 8 captures, all kept). Logs,
per step, each program's captures, captures again (the slots that moved, and whether to graph memory, a parameter
or elsewhere), drops after moves out of graph memory, judgements, and the reserved memory.

    python benchmarks/results/session49/churn_probe.py gelu:4096:4096 [steps]
"""
import sys

import torch

from fuseops.ops.executor import graphed

step_now = [0]
names: dict[int, str] = {}


def name(program) -> str:
    return names.setdefault(id(program), f"p{len(names)}")


def log(program, what: str) -> None:
    print(f"step {step_now[0]:2d} {name(program)} captures {program.captures} {what}", flush=True)


def where(address: int) -> str:
    """"pK" where ``address`` lies in program K's results in graph memory (at their start: "pK="),
    "graph" in graph memory otherwise, else "elsewhere"."""
    for program in list(graphed._holding):
        for r in program.pool_results:
            start = r.untyped_storage().data_ptr()
            if start <= address < start + r.untyped_storage().nbytes():
                return f"{name(program)}{'=' if address == start else ''}"
    return "graph" if address in graphed._graph_memory else "elsewhere"


def main() -> None:
    cell = sys.argv[1] if len(sys.argv) > 1 else "gelu:4096:4096"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    graphed.GPU_BOUND = float("inf")
    sys.argv = sys.argv[:1]
    from benchmarks.results.session46 import shared_pool
    P = graphed.GraphedProgram
    real = {m: getattr(P, m) for m in ("_capture", "_capture_again", "_measure_again", "_note_move", "_judge",
                                       "_stay_eager", "_replay", "_measure", "run")}

    def run(self, inputs):
        name(self)  # named in the order of first calls: forward blocks p0-p3, then the backward's
        return real["run"](self, inputs)

    def replay(self, inputs):
        busy = self.busy()
        moved = [(slot, slot in self.from_graphs, where(inputs[slot].data_ptr()))
                 for slot, address in self.pinned if slot < len(inputs) and inputs[slot].data_ptr() != address]
        out = real["_replay"](self, inputs)
        if step_now[0] <= 20 and (busy or moved or out is None):
            log(self, f"replay: busy {busy} moved (slot, from graphs, now) {moved} -> "
                      f"{'eager' if out is None else 'graph'} misses {self.misses} phase {self.phase}")
        return out

    def measure(self, inputs):
        if step_now[0] <= 20:
            log(self, f"measuring call: timed {len(self.timed)} inputs in graph memory "
                      f"{[i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and where(t.data_ptr()) != 'elsewhere']}")
        return real["_measure"](self, inputs)

    def capture(self, inputs):
        out = real["_capture"](self, inputs)
        log(self, f"captured: pinned {len(self.pinned)} copied {sorted(self.buffers)} phase {self.phase}; inputs "
                  f"{[(i, where(t.data_ptr())) for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)]}")
        return out

    def capture_again(self, inputs, keep):
        moved = [(slot, where(inputs[slot].data_ptr()) if slot < len(inputs) else "derived",
                  isinstance(inputs[slot], torch.nn.Parameter) if slot < len(inputs) else False)
                 for slot, address in self.pinned if slot < len(inputs) and inputs[slot].data_ptr() != address]
        log(self, f"capture again: moved {moved} busy_calls {self.busy_calls} clobber_calls {self.clobber_calls} "
                  f"settling {self.settling} keep {sorted(keep)}")
        return real["_capture_again"](self, inputs, keep)

    def measure_again(self):
        log(self, "measure again")
        return real["_measure_again"](self)

    def note_move(self, slot, new):
        log(self, f"note move: slot {slot} to {where(new)}")
        return real["_note_move"](self, slot, new)

    def judge(self):
        ready = len(self.timed) >= graphed.MEASURED_CALLS and self.timed[-1].end.query()
        before = self.phase
        out = real["_judge"](self)
        if ready:
            log(self, f"judged {before}->{self.phase} carried {self.samples_carried}")
        return out

    def stay_eager(self, reason):
        log(self, f"stay eager: {reason}")
        return real["_stay_eager"](self, reason)

    for m, f in (("_capture", capture), ("_capture_again", capture_again), ("_measure_again", measure_again),
                 ("_note_move", note_move), ("_judge", judge), ("_stay_eager", stay_eager), ("_replay", replay),
                 ("_measure", measure), ("run", run)):
        setattr(P, m, f)
    step = shared_pool.build(cell, False)
    for i in range(steps):
        step_now[0] = i
        step()
        if i % 5 == 4:
            torch.cuda.synchronize()
            print(f"-- step {i}: reserved {torch.cuda.memory_reserved() / 2**20:.0f} MB, allocated "
                  f"{torch.cuda.memory_allocated() / 2**20:.0f} MB, counts "
                  f"{ {k: v for k, v in graphed.counts.items() if v} }", flush=True)


if __name__ == "__main__":
    main()
