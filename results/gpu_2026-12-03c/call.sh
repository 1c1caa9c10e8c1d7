# Nineteenth session (2026-12-03): one device call. First (KERNELS=1) the two kernel measurements of kernels/NOTES.md
# "Measurements still to take" (results/cpu_2026-12-03b/state_slices.py and ss_bf16_pick.py, about a minute each);
# then MQAR's long-context cell (length 2048, 256 pairs) with one "plain" KLA block at d_model 128 and d_state
# $DSTATES (default 32), lr 2.2e-3, started or resumed from .carry/synthetic_state, for the rest of the call's 600 s
# less MARGIN (45 s). Carry `.whl` and `.carry/synthetic_state`; run it again, back to back, to resume what paused.
# At most 8 files come back: the two kernel tables, block.log, three results files and two 15 MB state parts. Then,
# here: `run_synthetic.py merge --from <files_at>/synthetic --results results/synthetic --state
# .carry/synthetic_state` and `report` (docs/synthetic.md, "For the GPU session").
start=$(date +%s)
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${KERNELS:-0}" = 1 ]; then
  timeout 150 python3 results/cpu_2026-12-03b/state_slices.py 2>&1 | tee $OUT/state_slices.md
  timeout 150 python3 results/cpu_2026-12-03b/ss_bf16_pick.py 2>&1 | tee $OUT/ss_bf16_pick.md
fi
left=$(( 600 - ($(date +%s) - start) - ${MARGIN:-45} ))
echo "== budget ${left}s"
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla --mqar-cells 2048x256 --mqar-depths 1 \
  --mqar-d-models 128 --mqar-d-states ${DSTATES:-32} --lrs 2.2e-3 --results $OUT/synthetic \
  --state .carry/synthetic_state --time-budget-s $left 2>&1 | tee $OUT/block.log | tail -25
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
