# GPU call of the eleventh session: one A/B round of the compiled LM step for the patches of
# results/cpu_2026-12-02/lm_step (HEAD, then each patch applied alone and reverted; only the models a patch changes).
# ROUND=1, then ROUND=2 in the next call. Run from the repository root. bench_lm: seq 2048, 32,768 tokens a step,
# compile on, 60 steps, tokens/s from the last 20-step window.
source scripts/device_setup.sh || exit 1
P=results/cpu_2026-12-02/lm_step
r=${ROUND:-1}
bench() { echo "== $1 $(date +%T)"; python3 scripts/bench_lm.py --models $2 --seq-len 2048 --tokens-per-step 32768 \
  --compile on --steps 60 --log-every 20 --out $OUT/$1.md 2>&1 | tail -8 | tee $OUT/$1.log; }
bench head_$r kla_45m,gpt_45m,mamba_45m
git apply $P/short_conv_shifted.patch && bench short_conv_$r kla_45m,mamba_45m; git apply -R $P/short_conv_shifted.patch
git apply $P/compiled_loss.patch && bench compiled_loss_$r kla_45m,gpt_45m; git apply -R $P/compiled_loss.patch
git apply $P/rope_table.patch && bench rope_table_$r gpt_45m; git apply -R $P/rope_table.patch
echo "== end $(date +%T)"
