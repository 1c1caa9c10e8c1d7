# Written in the eleventh session, first run in the twelfth (results/gpu_2026-12-02c): one device call of MQAR's
# long-context cell, length 2048 with 256 pairs, one "plain" KLA block at d_model 128 (the paper's MQAR claim), at
# the learning rates LRS (default 2.2e-3,1e-2; one unit at a time, each 2^19 tokens a step); DEPTHS (default 1) and
# DMODELS (default 128) and DSTATES (KLA's d_state, default 16; 64 is the plan's capacity test) pick other units of the cell (a d_model-256 unit's paused state: about 37 MiB, the d_model-128 unit's 17.1 MiB scaled by parameter count). Carry `.whl` and
# `.carry/synthetic_state`; run it again to resume what paused. First (unless TEST=0) the GPU tests of the captured,
# inductor-compiled step (the readout and the loss compile together since aa339c4). At most 8 files come back: the test log, block.log, three results files and up
# to three 15 MB parts of the paused state (two d_model-128 units: 33 MiB). Then, here: `run_synthetic.py merge
# --from <files_at>/synthetic --results results/synthetic --state .carry/synthetic_state` and `report`
# (docs/synthetic.md, "For the GPU session").
start=$(date +%s); source scripts/device_setup.sh || exit 1
mkdir -p $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
if [ "${TEST:-1}" = 1 ]; then
  timeout 150 python3 -m pytest -q -m gpu tests/tasks/test_graph.py -k "mqar or inductor" 2>&1 | tail -4 \
    | tee $OUT/test_graph.log
fi
left=$(( ${LIMIT:-545} - ($(date +%s) - start) )); echo "== budget ${left}s"
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla --mqar-cells 2048x256 --mqar-depths ${DEPTHS:-1} \
  --mqar-d-models ${DMODELS:-128} --mqar-d-states ${DSTATES:-16} --lrs ${LRS:-2.2e-3,1e-2} --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $left 2>&1 | tee $OUT/block.log | tail -25
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
