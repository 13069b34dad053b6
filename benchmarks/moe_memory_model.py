"""The MoE expert layer's memory, counted on a CPU (no GPU needed): per large tensor its size at
the Qwen3-30B-A3B and Mixtral-8x7B shapes, and per implementation the bytes alive at each stage
of one forward+backward, above the step's start (fuseops/moe/memory_model.py holds the stage
lists; they reproduce ``benchmarks.moe_layer``'s H100 measurement of plain torch and of the
composition to 0.01 GB).

    python -m benchmarks.moe_memory_model
"""

from __future__ import annotations

from fuseops.moe import memory_model as mm

SHAPES = {
    "qwen3-30b-a3b": mm.LayerShape(tokens=32768, top_k=8, hidden=2048, ffn=768, experts=128),
    "mixtral-8x7b": mm.LayerShape(tokens=8192, top_k=2, hidden=4096, ffn=14336, experts=8),
}
TENSORS = ("x_sorted", "z", "h", "y_sorted", "dy_sorted", "dx_sorted", "y", "dx", "dw1", "dw2")


def implementations(shape: mm.LayerShape) -> dict[str, list[mm.Stage]]:
    return {
        "torch (_grouped_mm composition)": mm.torch_stages(),
        "fuseops composed": mm.composed_stages(),
        "expert_layer default": mm.layer_stages(False, *mm.backward_plan(shape, False)),
        "expert_layer lean": mm.layer_stages(True, *mm.backward_plan(shape, True)),
    }


def main() -> None:
    gb = 1e9
    print("tensor sizes, GB:")
    print(f"{'tensor':<12}" + "".join(f"{s:>16}" for s in SHAPES))
    for t in TENSORS:
        print(f"{t:<12}" + "".join(f"{shape.bytes_of(t) / gb:>16.3f}" for shape in SHAPES.values()))
    for name, shape in SHAPES.items():
        print(f"\n{name}: bytes alive per stage above the step's start, GB")
        torch_peak = mm.peak_bytes(shape, mm.torch_stages())
        for impl, stages in implementations(shape).items():
            peak = mm.peak_bytes(shape, stages)
            print(f"  {impl:<34} peak {peak / gb:5.2f} ({peak / torch_peak:.2f}x torch)")
            print("      " + ", ".join(f"{s} {b / gb:.2f}" for s, b in mm.stage_bytes(shape, stages)))


if __name__ == "__main__":
    main()
