"""Session 53 probe (issue 20): session 53's host-path trims A/B in one process, on one model. "off" puts back what
each trim replaced (``FUSEOPS_DEBUG`` read through ``os.environ.get``; records filled at every replayed forward, and
in the compiled Sequential's operators; ``PlanFunction.apply`` through ``Function.apply``'s Python wrapper), "on" is
the tree as it is; torch eager beside them for the ratio (with ``--compiled``, also fuseops under torch.compile on and
off, and torch.compile of the torch model). Interleaved rounds (order reversed every other round); step ms (median
of synchronised steps) and host ms to enqueue a step after a drain, the best of the rounds, and each round's off/on
step ratio.

    python benchmarks/results/session53/ab_trims.py [--cells gelu:1024:2048 gelu:1024:1024] [--rounds 6] [--compiled]
"""
import argparse

import torch

from benchmarks.sizes import dense_cell, enqueue_ms, step_fn, time_ms
from fuseops import compiled_sequential
from fuseops.ops import _checks
from fuseops.ops.executor import function, prepared, saved_state

_TABLE, _FORWARD_BODY, _APPLY = _checks._ENVIRON_TABLE, function.forward_body, prepared.apply_eagerly


def _filled_forward_body(state, inputs, **kw):
    return _FORWARD_BODY(state, inputs, **{**kw, "fill": True})


def _wrapped_apply(state, *inputs):
    return function.PlanFunction.apply(state, *inputs)


def trims(on: bool) -> None:
    _checks._ENVIRON_TABLE = _TABLE if on else None
    function.forward_body = _FORWARD_BODY if on else _filled_forward_body
    prepared.apply_eagerly = _APPLY if on else _wrapped_apply
    compiled_sequential.forward_body = _FORWARD_BODY if on else _filled_forward_body
    compiled_sequential.Unfilled = saved_state.Unfilled if on else saved_state.fill_records


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:2048", "gelu:1024:1024"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--compiled", action="store_true")
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        fuseops_step, torch_step = step_fn(model, (x,), list(model.parameters())), \
            step_fn(reference, (x,), list(reference.parameters()))

        def with_trims(on: bool, run=fuseops_step):
            def trimmed() -> None:
                trims(on)
                run()
            return trimmed
        variants = {"on": with_trims(True), "off": with_trims(False), "torch": torch_step}
        if a.compiled:
            compiled_step = step_fn(torch.compile(model), (x,), list(model.parameters()))
            variants |= {"compiled on": with_trims(True, compiled_step), "compiled off": with_trims(False, compiled_step),
                         "torch.compile": step_fn(torch.compile(reference), (x,), list(reference.parameters()))}
        for step in variants.values():
            for _ in range(30):
                step()
        best: dict[str, tuple[float, float]] = {}
        ratios = []
        for r in range(a.rounds):
            got = {}
            for name, step in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                got[name] = (time_ms(step, "cuda", a.reps), enqueue_ms(step, "cuda", a.reps))
                old = best.get(name, got[name])
                best[name] = (min(got[name][0], old[0]), min(got[name][1], old[1]))
            ratios.append(f"{got['off'][0] / got['on'][0]:.3f}"
                          + (f" ({got['compiled off'][0] / got['compiled on'][0]:.3f})" if a.compiled else ""))
        trims(True)
        torch_ms = best["torch"][0]
        for name, (ms, host) in best.items():
            print(f"{cell:16} {name:13} step {ms:5.2f} ms  host {host:5.2f} ms  torch eager / this {torch_ms / ms:4.2f}x",
                  flush=True)
        print(f"{cell:16} off / on step, by round (compiled's in brackets): {' '.join(ratios)}", flush=True)


if __name__ == "__main__":
    main()
