# Eighteenth session (2026-12-03): one device call of MQAR's Zoology grid at cell $CELLS (default 128x8), two blocks,
# d_model $DMODELS (64), kla and gpt at the grid's four learning rates (packs of up to 4 units), for LIMIT (600) s
# less MARGIN (45 s); EXTRA passes more options (`--finish-only` for the last call of a session). Carry `.whl` and `.carry/synthetic_state`; then, here, merge and report.
start=$(date +%s)
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
left=$(( ${LIMIT:-600} - ($(date +%s) - start) - ${MARGIN:-45} ))
echo "== budget ${left}s"
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla,gpt --mqar-cells ${CELLS:-128x8} \
  --mqar-depths 2 --mqar-d-models ${DMODELS:-64} --mqar-d-states 16 --results $OUT/synthetic \
  --state .carry/synthetic_state --time-budget-s $left $EXTRA 2>&1 | tee $OUT/block.log | tail -30
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
