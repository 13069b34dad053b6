# Float32 weights under torch.autocast (bf16) on the GPU, after sessions 64-65's changes: fuseops against torch.nn.
timeout ${AUTOCAST_LIMIT:-200} python3 -m benchmarks.autocast --T 1024 --models qwen3 dense \
  > "$OUT_PART/autocast.log" 2>&1; echo "autocast rc=$?"; tail -6 "$OUT_PART/autocast.log" | cut -c1-250
