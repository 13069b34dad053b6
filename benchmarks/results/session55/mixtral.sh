# sizes.py MoE Mixtral, every T (~4 min): the issue-20 cells session 55 did not run (1.2x there is blocked, note 36).
timeout 400 python3 -m benchmarks.sizes --part moe --shapes mixtral --rounds 2 --out "$OUT_PART/sizes_mixtral" \
  > "$OUT_PART/sizes_mixtral.log" 2>&1; echo "sizes rc=$?"
grep -E "^cell|^mixtral |CUDA-graph" "$OUT_PART/sizes_mixtral.log" | cut -c1-250
