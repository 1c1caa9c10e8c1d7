# Written in the twentieth session (2026-12-03) for the next GPU session; not run yet. Two device calls, back to back
# (carry `.whl` and `.carry/synthetic_state`; merge between them). Each call, within LIMIT (600 s) less MARGIN (45 s):
# 1. MQAR's d_state-64 unit (long cell, one plain KLA block, d_model 128, lr 2.2e-3, seed 0), resumed from
#    .carry/synthetic_state (paused at 15,890 of 25,000; 9,110 steps at 59.8 ms): call 1 pauses it near the end,
#    call 2 finishes it in about two and a half minutes;
# 2. with more than 240 s left: the kernel measurements (kernels/NOTES.md, "Measurements still to take"): the
#    selective scan's GPU tests (its split config, merged in the twentieth session), `bench_scan.py --lengths
#    --skip-torch` (both scans over the lengths, the split config included) and
#    results/cpu_2026-12-03d/kla_lengths_configs.py (the KLA scan's channel blocks over the lengths);
# 3. with more than 120 s left: MQAR's Zoology grid, (128, 8) at d_model 64 and two blocks, kla and gpt (the units
#    not yet run: lr 1e-2).
# At most 8 files come back: block.log (both runs), kernels.md, three results files, up to three 15 MB state parts.
# Then, here: `run_synthetic.py merge --from <files_at>/synthetic --results results/synthetic --state
# .carry/synthetic_state` and `report`. If .carry/synthetic_state has no state for the unit, it starts from step 0
# (the runner says so): then it needs about 26 minutes over three calls.
start=$(date +%s)
left() { echo $(( ${LIMIT:-600} - ($(date +%s) - start) - ${MARGIN:-45} )); }
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "== the d_state-64 unit, budget $(left)s"
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla --mqar-cells 2048x256 --mqar-depths 1 \
  --mqar-d-models 128 --mqar-d-states 64 --lrs 2.2e-3 --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $(left) 2>&1 | tee $OUT/block.log | tail -12
if [ "$(left)" -gt 240 ]; then
  timeout $(( $(left) - 100 )) bash -c 'timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_selective_scan.py 2>&1 | tail -4
    python3 kernels/bench_scan.py --lengths --skip-torch
    python3 results/cpu_2026-12-03d/kla_lengths_configs.py' 2>&1 | tee $OUT/kernels.md
fi
if [ "$(left)" -gt 120 ]; then
  echo "== the (128, 8) grid, budget $(left)s" | tee -a $OUT/block.log
  python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla,gpt --mqar-cells 128x8 --mqar-depths 2 \
    --mqar-d-models 64 --mqar-d-states 16 --results $OUT/synthetic --state .carry/synthetic_state \
    --time-budget-s $(left) 2>&1 | tee -a $OUT/block.log | tail -20
fi
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
