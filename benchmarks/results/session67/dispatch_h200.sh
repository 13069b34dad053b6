# Issue 20 (compiled >= torch.compile at GPU-bound cells): the dense dispatch table's forward and dgrad epilogue
# rows were fitted on an H100 (session 14 / 60); every machine since session 64 is an H200 (4.8 against 3.35 TB/s:
# a separate elementwise pass costs less there). Session 67 call 5: at gelu T=16384 H=1024 fuseops' fused forward
# GEMMs took 1,907 us a step (8 launches) against torch.compile's cuBLAS GEMMs + GELU 1,820. The epilogue cells at
# the dense stack's widths, rows 4096 / 16384, both branches, on this H200.
timeout ${DISPATCH_LIMIT:-500} python3 -m benchmarks.dense_dispatch --rows 4096 16384 \
  --epilogues bias+gelu bias+residual dgrad+gelu dgrad+residual --out "$OUT_PART/dense_dispatch_h200.json" \
  > "$OUT_PART/dense_dispatch_h200.log" 2>&1; echo "dispatch rc=$?"
tail -40 "$OUT_PART/dense_dispatch_h200.log" | cut -c1-160
