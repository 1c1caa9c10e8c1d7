# GPU call of 2026-12-01 (seventh session): the tree with the candidates to merge applied (uncommitted here), then
# `--dtypes`, the kernel GPU tests and the whole-LM rows of kla_45m and gpt_45m, each while the call's time lasts.
source scripts/device_setup.sh || exit 1
start=$SECONDS; limit=${LIMIT:-430}
left() { echo $(( limit - (SECONDS - start) )); }
echo "== dtypes $(date +%T)"; timeout 100 python3 kernels/bench_scan.py --dtypes > $OUT/dtypes_merged.md 2>&1; tail -4 $OUT/dtypes_merged.md
echo "== gpu tests $(date +%T), $(left) s left"
timeout $(( $(left) - 20 < 210 ? $(left) - 20 : 210 )) python3 -m pytest tests/kernels -m gpu -q -p no:cacheprovider > $OUT/gpu_kernel_tests.log 2>&1; tail -3 $OUT/gpu_kernel_tests.log
echo "== lm $(date +%T), $(left) s left"
timeout $(( $(left) - 10 )) python3 scripts/bench_lm.py --models kla_45m,gpt_45m --seq-lens ${SEQ_LENS:-2048} --tokens-per-step 32768 \
  --compile on --out $OUT/lm_45m_merged.md > $OUT/lm.log 2>&1; tail -8 $OUT/lm.log
echo "== end $(date +%T)"
