# A5 block: resume/finish KLA depth-1 at L12/16/20 (if still paused), then KLA depth 2 at the lengths given in $D2_LENGTHS
start=$(date +%s)
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/*.jsonl $OUT/synthetic/
common="--plan full --families a5 --archs kla --seeds 0,1,2 --results $OUT/synthetic --state .carry/synthetic_state"
if [ -n "$D1" ]; then
  python3 scripts/run_synthetic.py run $common --a5-lengths 12,16,20 --a5-depths 1 --time-budget-s 240 2>&1 | tee $OUT/block_d1.log
fi
left=$(( 600 - ($(date +%s) - start) - ${MARGIN:-45} ))
echo "== depth 2 budget ${left}s"
python3 scripts/run_synthetic.py run $common --a5-lengths $D2_LENGTHS --a5-depths 2 --time-budget-s $left $EXTRA 2>&1 | tee $OUT/block_d2.log
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
