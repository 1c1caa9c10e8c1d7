# Written in the sixteenth session: one device call (carry `.whl` and `.carry/synthetic_state`; LIMIT, default 540 s,
# bounds the whole call). The tests below spend most of their time compiling Triton and inductor kernels on the
# host's CPUs, so they run beside the MQAR capacity unit instead of before it:
# 1. the scan headline after the fifteenth session's merges, alone on the GPU (`bench_scan.py --skip-torch`;
#    ca6ca19, before them: 0.567 / 2.584 ms);
# 2. in the background, the MQAR capacity unit resumes (one plain KLA block, d_model 128, d_state 64, (2048, 256),
#    lr 2.2e-3) until LIMIT; its rates in rates.jsonl are taken beside the tests, so they run slower than alone;
# 3. meanwhile: the kernel GPU tests (the two merged backward kernels, the wide-state launch configs), the
#    finiteness check's GPU tests, and MAD's six tasks captured through inductor against eager (MAD's first GPU run).
# Comes back: next_call.tgz (the logs), block.log, the three synthetic results files, the paused state in 15 MB parts.
# Then, here: unpack the state, `run_synthetic.py merge` and `report` (results/gpu_2026-12-02f/README.md's lessons).
start=$(date +%s); source scripts/device_setup.sh || exit 1
mkdir -p /tmp/nc $OUT/synthetic .carry/synthetic_state && cp results/synthetic/{mqar,progress,rates}.jsonl $OUT/synthetic/
trap 'tar -czf $OUT/next_call.tgz -C /tmp/nc .' EXIT
step() { local name=$1 limit=$2; shift 2; echo "== $name $(date +%T)"
  timeout "$limit" "$@" > /tmp/nc/$name.log 2>&1; echo "rc $? $(date +%T)" >> /tmp/nc/$name.log
  tail -6 /tmp/nc/$name.log; tar -czf $OUT/next_call.tgz -C /tmp/nc .; }
step scan_main 100 python3 kernels/bench_scan.py --skip-torch
left=$(( ${LIMIT:-540} - ($(date +%s) - start) )); echo "== mqar budget ${left}s $(date +%T)"
python3 scripts/run_synthetic.py run --plan full --families mqar --archs kla --mqar-cells 2048x256 --mqar-depths 1 \
  --mqar-d-models 128 --mqar-d-states 64 --lrs 2.2e-3 --results $OUT/synthetic --state .carry/synthetic_state \
  --time-budget-s $left > $OUT/block.log 2>&1 &
mqar=$!
step tests_kernels_gpu 300 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider -rA
step tests_finite_gpu 40 python3 -m pytest -q -m gpu tests/train/test_divergence.py -k all_finite -p no:cacheprovider
left=$(( ${LIMIT:-540} - 30 - ($(date +%s) - start) ))
[ "$left" -gt 60 ] && step tests_mad_gpu "$left" python3 -m pytest -q -m gpu tests/tasks/test_graph.py -k mad -rA
wait $mqar; echo "== mqar rc $? $(date +%T)"; tail -12 $OUT/block.log
tar -cf - -C .carry/synthetic_state . | split -b 15M -d - $OUT/state.tar.
echo "== end $(date +%T)"
