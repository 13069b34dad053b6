"""Session 50 probe: why the MoE composition (permute, the experts Sequential, unpermute; ``benchmarks.sizes``'
``fuseops`` column) captures again and drops graphs under FUSEOPS_CUDA_GRAPHS=all (run 4: 218 captures, 65 drops,
151 moves, 41 clobbers over eight cells, against 125 / 43 / 50 / 3 under the default rule). Session 49's churn
probe with the model swapped for ``FuseopsMoE`` (``mem_ab.py``'s ``moec:`` cells).

    python benchmarks/results/session50/churn_moe.py moe:qwen3:1024[:s] [steps]
"""
from benchmarks.results.session46 import shared_pool
from benchmarks.results.session49 import churn_probe
from benchmarks.results.session50.mem_ab import build_composition

if __name__ == "__main__":
    shared_pool.build = lambda cell, torch_model: build_composition("moec:" + cell.split(":", 1)[1], torch_model)
    churn_probe.main()
