#!/usr/bin/env bash
# The GPU test suite in parts, each of which fits in about ten minutes on one H100 / H200 (the
# kernels compile on first use, so a fresh machine takes longest). Logs (pytest -v: a hang shows
# the test it hung in) go under $OUT (default /tmp/fuseops-gpu); each part prints its exit code,
# its failures and pytest's summary line. LIMIT (seconds, default 540) bounds a part.
#
#   bash benchmarks/run_gpu.sh kernels [pytest args]   # gpu-marked tests/kernels, but quantize and hopper
#   bash benchmarks/run_gpu.sh hopper [pytest args]    # gpu-marked tests/kernels/hopper (sm_90 Gluon kernels)
#   bash benchmarks/run_gpu.sh quantize [pytest args]  # gpu-marked quantize kernel tests
#   bash benchmarks/run_gpu.sh fusions [pytest args]   # tests/fusions but the property suite and the CUDA edge cases
#   bash benchmarks/run_gpu.sh models [pytest args]    # tests/integrations and tests/offload
#   bash benchmarks/run_gpu.sh moe [pytest args]       # tests/moe but the quantized layer and the expert-parallel NCCL tests
#   bash benchmarks/run_gpu.sh moequant [pytest args]  # tests/moe/test_expert_layer_quantized.py
#   bash benchmarks/run_gpu.sh gathered [pytest args]  # the gathered-row GEMMs and the expert layer's lean mode, which runs them
#   bash benchmarks/run_gpu.sh ops [pytest args]       # tests/ops
#   bash benchmarks/run_gpu.sh quant [pytest args]     # tests/quant/test_quantize.py (long: run it by -k slices)
#   bash benchmarks/run_gpu.sh quantops [pytest args]  # tests/quant but test_quantize.py
#   bash benchmarks/run_gpu.sh top [pytest args]       # tests/test_*.py (compile, user CUDA graphs, torch.nn behaviour) but compiled bad input
#   bash benchmarks/run_gpu.sh badinput [pytest args]  # tests/test_compile_bad_input.py (every check under every compile mode)
#   bash benchmarks/run_gpu.sh examples [pytest args]  # the MoE language model example (its GPU runs: graphs, compile, recipes)
#   bash benchmarks/run_gpu.sh examplebench [pytest args] # the example's benchmark (a smoke run that writes results and a plot)
#   bash benchmarks/run_gpu.sh distributed [pytest args] # tests/distributed and the expert-parallel NCCL tests (one GPU: world size 1; 2+ GPUs: the rest)
#   bash benchmarks/run_gpu.sh props "GroupedMLP"      # the CUDA property suite for the fusions selected by -k
#   bash benchmarks/run_gpu.sh edge "LayerNorm or RMSNorm"   # the CUDA edge cases of the subjects selected by -k
#   bash benchmarks/run_gpu.sh bench linear moe_layer  # benchmarks by name (python -m benchmarks.<name>)
#
# The property suite and the edge cases take one to two minutes a fusion on CUDA: select a few
# per call. The CPU tests of a part run too, on the GPU's torch: the oldest supported one.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-dev}
out=${OUT:-/tmp/fuseops-gpu}
mkdir -p "$out"
part=${1:-kernels}
shift || true
limit=${LIMIT:-540}
pytest_part() {
  # SIGINT first, so that pytest prints its summary of what ran; KILL if it hangs in CUDA.
  timeout -s INT -k 20 "$limit" python3 -m pytest -p no:cacheprovider -rfE --tb=short -v "$@" > "$out/$part.log" 2>&1
  echo "$part rc=$?"
  grep -E "^(FAILED|ERROR)" "$out/$part.log" | cut -c1-200
  tail -1 "$out/$part.log" | cut -c1-200
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$part" in
  kernels) pytest_part -m gpu tests/kernels --ignore=tests/kernels/quantization/test_quantize.py \
      --ignore=tests/kernels/hopper "$@" ;;
  hopper) pytest_part -m gpu tests/kernels/hopper "$@" ;;
  quantize) pytest_part -m gpu tests/kernels/quantization/test_quantize.py "$@" ;;
  fusions) pytest_part tests/fusions --ignore=tests/fusions/test_fusion_properties.py \
      -k "not test_edge_case_on_cuda" "$@" ;;
  models) pytest_part tests/integrations tests/offload "$@" ;;
  moe) pytest_part tests/moe --ignore=tests/moe/test_expert_layer_quantized.py \
      --ignore=tests/moe/test_expert_parallel_capacity.py --ignore=tests/moe/test_expert_parallel_composition.py "$@" ;;
  moequant) pytest_part tests/moe/test_expert_layer_quantized.py "$@" ;;
  gathered) pytest_part tests/kernels/gemm tests/moe/test_expert_layer.py -k "gather or lean or peak_memory" "$@" ;;
  ops) pytest_part tests/ops "$@" ;;
  quant) pytest_part tests/quant/test_quantize.py "$@" ;;
  quantops) pytest_part tests/quant --ignore=tests/quant/test_quantize.py "$@" ;;
  top) pytest_part $(ls tests/test_*.py | grep -v test_compile_bad_input.py) "$@" ;;  # (--ignore skips no file named)
  badinput) pytest_part tests/test_compile_bad_input.py "$@" ;;
  examples) pytest_part tests/examples --ignore=tests/examples/test_train_moe_lm_benchmark.py "$@" ;;
  examplebench) pytest_part tests/examples/test_train_moe_lm_benchmark.py "$@" ;;
  distributed) pytest_part tests/distributed tests/moe/test_expert_parallel_capacity.py tests/moe/test_expert_parallel_overlap.py tests/moe/test_expert_parallel_composition.py "$@" ;;
  props) pytest_part tests/fusions/test_fusion_properties.py -k "cuda and (${1:-not nothing})" ;;
  edge) pytest_part tests/fusions/test_edge_cases.py -k "test_edge_case_on_cuda and (${1:-not nothing})" ;;
  bench)
    for name in "$@"; do
      echo "== $name"
      timeout "$limit" python3 -m "benchmarks.$name" > "$out/$name.log" 2>&1
      echo "rc=$?"
      tail -15 "$out/$name.log"
    done
    ;;
  *) echo "unknown part: $part"; exit 2 ;;
esac
