# Written in the twenty-first session (2026-12-03). One device call (carry `.whl` and `.carry/synthetic_state`;
# merge afterwards as results/cpu_2026-12-03d/next_call.sh says), within LIMIT (600 s) less MARGIN (45 s):
# 1. with TEST=1 (default): the KLA scan's GPU test at wide keys, S 32, 64 and 128 (128 runs as eight scans of 16
#    since this session) against the float64 reference (`-k large_state_default`);
# 2. MQAR's long cell with one plain KLA block at d_model 128 and d_state 128 (lr 2.2e-3, seed 0: the capacity
#    stage's last unit, 2 pairs per key dimension), started or resumed from .carry/synthetic_state and paused at the
#    budget's end (about 108 ms a step by `plan`'s extrapolation: 25,000 steps are about three sessions of calls).
start=$(date +%s)
left() { echo $(( ${LIMIT:-600} - ($(date +%s) - start) - ${MARGIN:-45} )); }
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${TEST:-1}" = 1 ]; then
  timeout 150 python3 -m pytest -q -s -m gpu tests/kernels/test_mobius_scan.py -k large_state_default 2>&1 \
    | tail -6 | tee $OUT/test.log
fi
echo "== the d_state-128 unit, budget $(left)s" | tee $OUT/block.log
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla --mqar-cells 2048x256 --mqar-depths 1 \
  --mqar-d-models 128 --mqar-d-states 128 --lrs 2.2e-3 --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $(left) 2>&1 | tee -a $OUT/block.log | tail -12
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
