# Session 37, call 1 (prepared in session 36): two Gluon kernels written after session 36's device
# time was spent, hopper/tensor_scaled_wgrad.py (the FP8 per-tensor grouped wgrad) and
# hopper/tensor_scaled_pingpong.py (the forward / dgrad with the consumers on alternate tiles).
# (a) Their GPU tests and tensor_scaled's (chained_steps moved into pipeline.py; in session 37, before
# this ran, each family's consumer became one: hopper/fp8_forward.py and fp8_wgrad.py, block scales by a
# constexpr, the epilogue pipeline.store_rows; offline for sm_90a the blockwise kernels' SASS is
# unchanged; the per-tensor kernels load each group's two factors as scalars now, not a vector per
# row and per column: tensor_scaled's SASS 3256 -> 2352 instructions, LDG 162 -> 34, its spills
# with a bias 80 bytes -> 0, the ping-pong's 4 -> 0; tests/kernels/hopper in call 2). (b) Their tiles
# against the Triton kernels and the cooperative Gluon one at the Qwen3 shape (fp8_gemm_tiles).
# (c) An A/B of the expert layer under FP8 current scaling: the tree as it is; a copy whose dispatch
# table routes the wgrad to the new kernel; one that also routes the forward / dgrad to the ping-pong
# kernel (session 36: Qwen3 12.45-12.46 ms a micro-batch of eight, 1.28-1.30x bf16; 1.3x needs
# ~0.2 ms more). ~7 min; at most ~9.5 (the timeouts), the ping-pong kernel, new and never run, last in each
# part in case it hangs.
export PYTHONUNBUFFERED=1
S=$SECONDS
PYTHONPATH=. timeout -s INT 170 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/kernels/hopper/test_tensor_scaled.py tests/kernels/hopper/test_tensor_scaled_wgrad.py tests/kernels/hopper/test_tensor_scaled_pingpong.py 2>&1 | tail -12 | cut -c1-300
echo "tests ($((SECONDS - S)) s)"; S=$SECONDS
PYTHONPATH=. timeout 120 python3 -m benchmarks.fp8_gemm_tiles --library-only --out $OUT/gluon_tiles_qwen3.json > $OUT/gluon_tiles_qwen3.log 2>&1
echo "tiles rc=$? ($((SECONDS - S)) s)"; grep -A8 "fastest per GEMM" $OUT/gluon_tiles_qwen3.log | cut -c1-160; S=$SECONDS
rm -rf /tmp/ab /tmp/ab2 && mkdir /tmp/ab && cp -r fuseops benchmarks tests /tmp/ab/
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
for ab in "as_is $PWD" "wgrad /tmp/ab" "wgrad_pingpong /tmp/ab2"; do
  set -- $ab
  (cd $2 && PYTHONPATH=. timeout 90 python3 -m benchmarks.fp8_moe --shapes qwen3-30b-a3b --recipes "fp8 current" --rounds 3 --out $OUT/fp8_moe_wgrad_$1.json > $OUT/fp8_moe_wgrad_$1.log 2>&1)
  echo "fp8_moe wgrad $1 rc=$? ($((SECONDS - S)) s)"; grep -E "micro-batch" $OUT/fp8_moe_wgrad_$1.log | cut -c1-120; S=$SECONDS
done
