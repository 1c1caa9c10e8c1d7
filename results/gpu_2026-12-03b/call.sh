# Eighteenth session (2026-12-03): one device call. First (PICK=1) the S 64 launch-config pick
# (results/cpu_2026-12-03/s64_pick.py, about 40 s) and (KTEST=1) the kernel GPU tests at wide states; then an A5 block
# of GDN at lengths $LENGTHS and depths $DEPTHS (3 seeds, packs resumed from .carry/synthetic_state) for the rest of
# the call's 600 s less MARGIN (45 s). Carry `.whl` and `.carry/synthetic_state`; then, here, merge and report
# (docs/synthetic.md, "For the GPU session").
start=$(date +%s)
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{a5,progress,rates}.jsonl $OUT/synthetic/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${PICK:-0}" = 1 ]; then timeout 120 python3 results/cpu_2026-12-03/s64_pick.py 2>&1 | tee $OUT/s64_pick.md; fi
if [ "${KTEST:-0}" = 1 ]; then
  timeout 150 python3 -m pytest -q -m gpu tests/kernels -k large_state 2>&1 | tail -6 | tee $OUT/kernel_tests.log
fi
left=$(( 600 - ($(date +%s) - start) - ${MARGIN:-45} ))
echo "== budget ${left}s"
python3 scripts/run_synthetic.py run --plan full --families a5 --archs ${ARCHS:-gdn} --seeds 0,1,2 \
  --a5-lengths ${LENGTHS:-16,20} --a5-depths ${DEPTHS:-2,3} --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $left 2>&1 | tee $OUT/block.log | tail -30
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
