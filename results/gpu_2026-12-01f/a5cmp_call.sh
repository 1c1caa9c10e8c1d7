# A5 block, sixth session of 2026-12-01: depth 2 of $ARCHS at lengths $LENGTHS (3 seeds), packs resumed from
# .carry/synthetic_state; the runner's budget is the rest of the call's 600 s less MARGIN (45 s)
start=$(date +%s)
source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/*.jsonl $OUT/synthetic/
left=$(( 600 - ($(date +%s) - start) - ${MARGIN:-45} ))
echo "== budget ${left}s"
python3 scripts/run_synthetic.py run --plan full --families a5 --archs ${ARCHS:-gpt,mamba,gdn} --seeds 0,1,2 \
  --a5-lengths ${LENGTHS:-12,16,20} --a5-depths ${DEPTHS:-2} --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $left $EXTRA 2>&1 | tee $OUT/block.log
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
ls -la .carry/synthetic_state; echo "== end $(( $(date +%s) - start ))s"
