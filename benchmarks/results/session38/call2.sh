# Session 38, call 2: call 1's A/B again (session 37's call 1 copied the tree without pyproject.toml, and
# fuseops/__init__ reads its version there: both patched copies failed at import), then session 37's
# call 3 but its sizes part (fp8_moe --main-grad at Qwen3, both FP8 recipes; the blockwise GEMMs alone).
# ~7 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
rm -rf /tmp/ab /tmp/ab2 && mkdir /tmp/ab && cp -r fuseops benchmarks tests pyproject.toml /tmp/ab/
python3 - <<'PY'
from pathlib import Path
p = Path("/tmp/ab/fuseops/kernels/dispatch.py")
s = p.read_text()
anchor = "    Route(Kernel.GROUPED_GEMM_SCALED_WGRAD, Backend.SM90, blockwise_wgrad.grouped_gemm_scaled_wgrad,"
assert anchor in s
s = s.replace(anchor, "    Route(Kernel.GROUPED_GEMM_SCALED_WGRAD, Backend.SM90, tensor_scaled_wgrad.grouped_gemm_scaled_wgrad,\n"
              "          tensor_scaled_wgrad.serves, 'A/B'),\n" + anchor)
s = s.replace("pipeline, tensor_scaled, wgrad", "pipeline, tensor_scaled, tensor_scaled_wgrad, wgrad")
p.write_text(s)
PY
cp -r /tmp/ab /tmp/ab2
python3 - <<'PY'
from pathlib import Path
p = Path("/tmp/ab2/fuseops/kernels/dispatch.py")
s = p.read_text()
assert "Route(Kernel.GROUPED_GEMM_SCALED, Backend.SM90, tensor_scaled.grouped_gemm_scaled," in s
s = s.replace("Route(Kernel.GROUPED_GEMM_SCALED, Backend.SM90, tensor_scaled.grouped_gemm_scaled,",
              "Route(Kernel.GROUPED_GEMM_SCALED, Backend.SM90, tensor_scaled_pingpong.grouped_gemm_scaled,")
s = s.replace("pipeline, tensor_scaled, tensor_scaled_wgrad, wgrad",
              "pipeline, tensor_scaled, tensor_scaled_pingpong, tensor_scaled_wgrad, wgrad")
p.write_text(s)
PY
for ab in "as_is $PWD" "wgrad /tmp/ab" "wgrad_pingpong /tmp/ab2" "as_is_again $PWD"; do
  set -- $ab
  (cd $2 && PYTHONPATH=. timeout 90 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_wgrad_$1.json > $OUT/fp8_moe_wgrad_$1.log 2>&1)
  echo "fp8_moe wgrad $1 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_wgrad_$1.log | cut -c1-120; S=$SECONDS
done
S=$SECONDS
timeout 200 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" "fp8 blockwise" --main-grad \
  --rounds 3 --out $OUT/fp8_moe_main_grad.json > $OUT/fp8_moe_main_grad.log 2>&1
echo "fp8_moe main_grad rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_main_grad.log | cut -c1-120; S=$SECONDS
timeout 100 python3 -m benchmarks.fp8_gemm_tiles --recipe "fp8 blockwise" --library-only --out $OUT/blockwise_tiles_qwen3.json \
  > $OUT/blockwise_tiles_qwen3.log 2>&1
echo "blockwise tiles rc=$? ($((SECONDS - S)) s)"; tail -12 $OUT/blockwise_tiles_qwen3.log | cut -c1-160; S=$SECONDS
