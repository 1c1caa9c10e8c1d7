# GPU call 2 of the ninth session of 2026-12-01, run from the repository root with two candidates of
# results/cpu_2026-12-01h applied in the working tree (ss_bwd_spread_dd, logvar_precision_once: the form merged after
# it): kernels_call.sh (--dtypes on that tree and with logvar_bwd_precision_once, then the selective-scan and KLA
# kernel GPU tests with logvar_bwd_precision_once applied), then compiled whole-LM rows at T = 2048 while time is left.
start=$SECONDS
LIMIT=420 MARGIN=60 CANDIDATES="main logvar_bwd_precision_once" TEST=logvar_bwd_precision_once \
  bash results/gpu_2026-12-01h/kernels_call.sh
source scripts/device_setup.sh > /dev/null || exit 1
left=$(( ${LIMIT:-585} - (SECONDS - start) ))
echo "== lm $(date +%T), ${left} s left"
timeout $(( left - 5 )) python3 scripts/bench_lm.py --models kla_45m,gpt_45m,mamba_45m --seq-lens 2048 --tokens-per-step 32768 \
  --compile on --out $OUT/lm_45m_2048.md > $OUT/lm_45m_2048.log 2>&1; tail -8 $OUT/lm_45m_2048.log
echo "== end $(date +%T)"
