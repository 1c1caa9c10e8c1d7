# Written in the twenty-first session (2026-12-03) for a device call after results/cpu_2026-12-03d/next_call.sh has
# finished MQAR's d_state-64 unit (carry `.whl` and `.carry/synthetic_state`; merge afterwards as there).
# MQAR, Zoology's grid, two blocks, kla and gpt, within LIMIT (600 s) less MARGIN (45 s): the ready units of CELLS
# (default 128x8,512x64) at D_MODELS (default 64), in the plan's order (cell, width, arch, rate), up to four side by
# side in one process. (512, 64) is the grid's hardest cell (64 pairs in a 512-token example). What does not finish
# pauses into .carry/synthetic_state; the next call of this script resumes it.
start=$(date +%s)
left() { echo $(( ${LIMIT:-600} - ($(date +%s) - start) - ${MARGIN:-45} )); }
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "== the grid, cells ${CELLS:=128x8,512x64} at d_model ${D_MODELS:=64}, budget $(left)s" | tee $OUT/block.log
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla,gpt --mqar-cells $CELLS \
  --mqar-depths 2 --mqar-d-models $D_MODELS --mqar-d-states 16 --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $(left) 2>&1 | tee -a $OUT/block.log | tail -25
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
