# Written in the twenty-second session (2026-12-03). One device call (carry `.whl` and `.carry/synthetic_state`),
# within LIMIT (600 s) less MARGIN (45 s): MQAR's long cell with one plain KLA block at d_model 128 and d_state 128
# (lr 2.2e-3, seed 0), resumed from .carry/synthetic_state and paused at the budget's end. Unlike
# results/cpu_2026-12-03e/dstate128_call.sh, the unit saves a checkpoint every CHECKPOINT_S (120 s) and `pack
# --every-s 20` ships each one into $OUT, so a call the device stops early (it gives less than timeout_s when less
# device time is left, and a cold start takes one to four minutes of it) brings back the last checkpoint instead of
# nothing. Afterwards, here: `merge --from <files_at>/synthetic --results results/synthetic --state
# .carry/synthetic_state`; if the call was stopped (rc 124), also `progress --state .carry/synthetic_state --results
# results/synthetic`.
start=$(date +%s)
left() { echo $(( ${LIMIT:-600} - ($(date +%s) - start) - ${MARGIN:-45} )); }
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 scripts/run_synthetic.py pack --state .carry/synthetic_state --out $OUT --every-s 20 & watcher=$!
echo "== the d_state-128 unit, budget $(left)s" | tee $OUT/block.log
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla --mqar-cells 2048x256 --mqar-depths 1 \
  --mqar-d-models 128 --mqar-d-states 128 --lrs 2.2e-3 --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $(left) --checkpoint-every-s ${CHECKPOINT_S:-120} 2>&1 | tee -a $OUT/block.log | tail -12
kill $watcher; python3 scripts/run_synthetic.py pack --state .carry/synthetic_state --out $OUT
ls -la .carry/synthetic_state $OUT; echo "== end $(( $(date +%s) - start ))s"
