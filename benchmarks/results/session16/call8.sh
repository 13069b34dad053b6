# Session 16, device call 8: call 7's edge-case failure (a test bug: the float64 oracle got CUDA
# split sizes) re-run after its fix, and the CUDA edge-case and property tests of the two dense
# forward fusions whose Linear.save call the executor cuts changed.
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=dev
timeout -s INT 330 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/fusions/test_edge_cases.py \
  tests/fusions/test_fusion_properties.py \
  -k "cuda and (GroupedLinear-zero_rows or ForwardLinearBiasActivation or ForwardLinearAddExtraInput)" > $OUT/tests_fusions.log 2>&1
echo "fusion tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/tests_fusions.log | cut -c1-220; tail -1 $OUT/tests_fusions.log
