# GPU call of 2026-12-01 (eighth session): on the committed tree, `--dtypes`, the kernel GPU tests, then whole-LM rows
# with compile on (45M at T = 2048 and 16384, then 180M at T = 2048), each while the call's LIMIT lasts.
source scripts/device_setup.sh || exit 1
start=$SECONDS; limit=${LIMIT:-540}
left() { echo $(( limit - (SECONDS - start) )); }
echo "== dtypes $(date +%T)"; timeout 100 python3 kernels/bench_scan.py --dtypes > $OUT/dtypes_committed.md 2>&1; tail -4 $OUT/dtypes_committed.md
echo "== gpu tests $(date +%T), $(left) s left"
timeout 230 python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider > $OUT/gpu_kernel_tests.log 2>&1; tail -3 $OUT/gpu_kernel_tests.log
lm() {  # lm NAME MODELS SEQ_LENS: one bench_lm table, unless less than MIN s are left
  if (( $(left) < ${MIN:-60} )); then echo "== lm $1 skipped (time)"; return; fi
  echo "== lm $1 $(date +%T), $(left) s left"
  timeout $(( $(left) - 10 )) python3 scripts/bench_lm.py --models $2 --seq-lens $3 --tokens-per-step 32768 \
    --compile on --out $OUT/$1.md > /tmp/$1.log 2>&1; tail -6 /tmp/$1.log
}
lm lm_45m_2048 kla_45m,gpt_45m,mamba_45m 2048
lm lm_45m_16384 kla_45m,gpt_45m 16384
lm lm_180m_2048 kla_180m,gpt_180m 2048
echo "== end $(date +%T)"
