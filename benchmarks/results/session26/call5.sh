# Session 26, device call 5: copy.deepcopy / torch.save of a model with CUDA graphs (call 4 found
# deepcopy raising), the MoE layer at T=1024 again (its script needed the fix), then the GELU half
# of the dense sizes table.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_torch_nn_behaviour.py --tb=short > $OUT/nn.log 2>&1
echo "torch.nn behaviour tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/nn.log | cut -c1-200; tail -1 $OUT/nn.log; S=$SECONDS
timeout 150 python3 benchmarks/results/session26/moe_small.py 1024 2>&1 | grep -v "Warn\|gc.get_objects\|return Variable\|^  warn"
echo "moe_small ($((SECONDS - S)) s)"; S=$SECONDS
timeout 250 python3 -m benchmarks.sizes --part dense --acts gelu --rounds 2 --reps 10 --out $OUT/sizes_dense_gelu > $OUT/sizes_dense_gelu.log 2>&1
echo "sizes dense gelu rc=$? ($((SECONDS - S)) s)"; tail -11 $OUT/sizes_dense_gelu.log | cut -c1-220
