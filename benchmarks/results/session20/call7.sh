# Session 20, device call 7: call 6's A/B again with the base tree importable (call 6's base run
# failed: no pyproject.toml beside it), alternating base and merged twice; then the dense sizes
# table's host-bound cells (GELU, H=1024, T=1024 and 4096) with this tree.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
for _ in 1 2; do
  for r in build/base .; do
    FUSEOPS_ROOT=$r timeout 200 python3 benchmarks/results/session20/compiled_gap.py 1024,1024 4096,1024 2>&1 \
      | grep -E "^fuseops from|^T=" | sed "s|^|[$r] |"
  done
done
echo "A/B done ($((SECONDS - S)) s)"
timeout $((570 - (SECONDS - S))) python3 -m benchmarks.sizes --part dense --acts gelu --T 1024 4096 --H 1024 --out $OUT/sizes_dense > $OUT/sizes.log 2>&1
echo "sizes rc=$? ($((SECONDS - S)) s)"; tail -12 $OUT/sizes.log | cut -c1-250
