#!/usr/bin/env bash
# GPU verification in parts that each fit one 10-minute device call (H100, measured
# 2026-11-22: kernels ~9 min for the 181 gpu kernel tests, rest ~6.5 min, the CUDA property
# suite 40-115 s per fusion). Logs (pytest -v, so a hang shows the test it hung in) and
# results go under $OUT (or /tmp/fuseops-gpu); a short table is printed last.
#
#   bash benchmarks/run_gpu.sh kernels [pytest args]    # gpu-marked kernel tests but the quantize and Hopper ones
#                                                         # (session 44: with the Hopper ones the part reached 65 %
#                                                         # in 466 s, so they are a part of their own:)
#   bash benchmarks/run_gpu.sh hopper [pytest args]     # gpu-marked tests/kernels/hopper (session 44: 88 of its
#                                                         # 110 with 13 small others in 228 s)
#   bash benchmarks/run_gpu.sh quantize [pytest args]   # gpu-marked quantize kernel tests (~2 min)
#   bash benchmarks/run_gpu.sh rest [pytest args]       # everything else but the property suite (over 9 min
#                                                         # in session 11: too long for one call; its two parts:)
#   bash benchmarks/run_gpu.sh models [pytest args]     # tests/fusions but the property suite and the CUDA edge
#                                                         # cases (those are the `props` / `edge` parts'; session
#                                                         # 42: fusions to test_grouped_mlp.py, 452 tests, in 282 s)
#   bash benchmarks/run_gpu.sh models2 [pytest args]    # tests/integrations and tests/offload (~420 tests)
#   bash benchmarks/run_gpu.sh layers [pytest args]     # ops, quant, top-level tests (over 9 min in session 20: its two parts:)
#   bash benchmarks/run_gpu.sh moe [pytest args]        # tests/moe (session 45: with tests/ops one part
#                                                         # reached 74 % in 520 s, so they are two:)
#   bash benchmarks/run_gpu.sh ops [pytest args]        # tests/ops
#   bash benchmarks/run_gpu.sh quant [pytest args]      # tests/quant/test_quantize.py (27 % in 8.5 min in
#                                                         # session 20: run it by -k slices)
#   bash benchmarks/run_gpu.sh quantops [pytest args]   # tests/quant but test_quantize.py (session 27: 147
#                                                         # tests, most of a 9.5-minute call with the next two files)
#   bash benchmarks/run_gpu.sh top [pytest args]        # the top-level tests, tests/test_*.py (session 27: the
#                                                         # two parts together ran past 9.5 minutes; session 41:
#                                                         # top alone 2.3 min)
#   bash benchmarks/run_gpu.sh fp8layer [pytest args]   # session 32's issue-24 change: expert_layer's quantized
#                                                         # Function, quantize of picked rows, row_amax
#   bash benchmarks/run_gpu.sh graphs [pytest args]     # CUDA graphs of recorded programs and of the routing
#                                                         # (gpu-marked; session 48: 71 tests in 99-138 s)
#   bash benchmarks/run_gpu.sh props "GroupedMLP or Backward"   # CUDA property suite, some fusions
#                                                         # (session 44: all 14 in 1,190 s over four calls; the
#                                                         # quantized forwards ~130 s each)
#   bash benchmarks/run_gpu.sh edge "LayerNorm or RMSNorm"      # CUDA edge cases, some subjects (session 21,
#                                                         # torch 2.11: ~7 s a case for elementwise ops,
#                                                         # ~13-22 s dense fusions, ~90 s GroupedMLP,
#                                                         # ~50 s quantized subjects)
#   bash benchmarks/run_gpu.sh bench linear moe_layer   # benchmarks; results.tar comes back
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-dev}
out=${OUT:-/tmp/fuseops-gpu}
mkdir -p "$out"
part=${1:-rest}
shift || true
limit=${LIMIT:-540}
pytest_part() {
  # SIGINT first, so pytest prints its summary of what ran; KILL if it hangs in CUDA.
  timeout -s INT -k 20 "$limit" python3 -m pytest -p no:cacheprovider -rfE --tb=short -v "$@" > "$out/$part.log" 2>&1
  echo "$part rc=$?"
  grep -E "^(FAILED|ERROR)" "$out/$part.log" | cut -c1-200
  tail -1 "$out/$part.log" | cut -c1-200
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$part" in
  # Split since the staged quantize tilings (session 9) took the whole part past 9.5 minutes.
  kernels) pytest_part -m gpu tests/kernels --ignore=tests/kernels/quantization/test_quantize.py \
      --ignore=tests/kernels/hopper "$@" ;;
  hopper) pytest_part -m gpu tests/kernels/hopper "$@" ;;
  quantize) pytest_part -m gpu tests/kernels/quantization/test_quantize.py "$@" ;;
  rest) pytest_part tests --ignore=tests/kernels --ignore=tests/distributed \
      --ignore=tests/fusions/test_fusion_properties.py "$@" ;;
  models) pytest_part tests/fusions --ignore=tests/fusions/test_fusion_properties.py \
      -k "not test_edge_case_on_cuda" "$@" ;;
  models2) pytest_part tests/integrations tests/offload "$@" ;;
  layers) pytest_part tests --ignore=tests/kernels --ignore=tests/distributed --ignore=tests/fusions \
      --ignore=tests/integrations --ignore=tests/offload "$@" ;;
  moe) pytest_part tests/moe "$@" ;;
  ops) pytest_part tests/ops "$@" ;;
  quant) pytest_part tests/quant/test_quantize.py "$@" ;;
  quantops) pytest_part tests/quant --ignore=tests/quant/test_quantize.py "$@" ;;
  top) pytest_part tests/test_*.py "$@" ;;
  fp8layer) pytest_part tests/moe/test_expert_layer_quantized.py tests/kernels/quantization/test_amax.py \
      tests/quant/test_quantize.py tests/quant/test_custom_ops.py tests/kernels/quantization/test_quantize.py \
      -k "quantized or amax or picked or bad_offsets_or_rows" "$@" ;;
  graphs) pytest_part -m gpu tests/ops/executor tests/moe/test_routing_graphs.py "$@" ;;
  props) pytest_part tests/fusions/test_fusion_properties.py -k "cuda and (${1:-not nothing})" ;;
  edge) pytest_part tests/fusions/test_edge_cases.py -k "test_edge_case_on_cuda and (${1:-not nothing})" ;;
  bench)
    for name in "$@"; do
      echo "== $name"
      timeout "$limit" python3 "benchmarks/$name.py" > "$out/$name.log" 2>&1
      echo "rc=$?"
      tail -15 "$out/$name.log"
    done
    tar -cf "$out/results.tar" benchmarks/results "$out"/*.log 2>/dev/null
    ;;
esac
