"""Session 51: issue 20's table from the runs' sizes JSON (H100, FUSEOPS_CUDA_GRAPHS=1)."""
import json
import sys

print("| cell | fuseops ms | torch ms | torch.compile ms | eager ratio | compiled ratio | host ms f / t | layer ratio | layer host ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sys.argv[1:]:
    with open(path) as f:
        rows = json.load(f)["rows"]
    for r in rows:
        name = f"{r['act']} H={r['H']} T={r['T']}" if r["part"] == "dense" else f"{r.get('shape')} T={r['T']} {r.get('routing', '')}"
        best = min(r["torch_ms"], r["torch_compiled_ms"])
        hb = " (host-bound)" if r.get("host_bound") else ""
        layer = f"{best / r['fuseops_layer_ms']:.2f}x" if "fuseops_layer_ms" in r else "-"
        lhost = f"{r['fuseops_layer_enqueue_ms']:.2f}" if "fuseops_layer_enqueue_ms" in r else "-"
        print(f"| {name}{hb} | {r['fuseops_ms']:.2f} | {r['torch_ms']:.2f} | {r['torch_compiled_ms']:.2f} | "
              f"{best / r['fuseops_ms']:.2f}x | {r['torch_compiled_ms'] / r['fuseops_compiled_ms']:.2f}x | "
              f"{r['fuseops_enqueue_ms']:.2f} / {r['torch_enqueue_ms']:.2f} | {layer} | {lhost} |")
