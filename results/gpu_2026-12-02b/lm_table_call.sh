# Written in the eleventh session after its GPU time was spent; run in the twelfth (results/gpu_2026-12-02c, call 1,
# 519 s; kernels/NOTES.md, "Twelfth session"). One device call, carry `.whl`: the whole-LM table on main (compiled;
# 45M at T 2048, 8192, 16384 and 32768, 180M at T 2048), an A/B of fused AdamW (`optim.fused=true`) in two rounds,
# and the compiled step's profile of kla_45m and gpt_45m. Everything comes back as one archive, lm_table.tgz,
# rewritten after every run so that a call stopped by its time limit still returns what finished.
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/lm
bench() { local name=$1; shift; echo "== $name $(date +%T)"
  python3 scripts/bench_lm.py --tokens-per-step 32768 --compile on "$@" --out /tmp/lm/$name.md 2>&1 | tail -9 \
    | tee /tmp/lm/$name.log; tar -czf $OUT/lm_table.tgz -C /tmp/lm .; }
long=(--steps 60 --log-every 20)
bench lm_45m_2048 --models kla_45m,gpt_45m,mamba_45m,gpt_kla_45m --seq-len 2048 "${long[@]}"
bench fused_1 --models kla_45m,gpt_45m --seq-len 2048 "${long[@]}" --override optim.fused=true
bench foreach_2 --models kla_45m,gpt_45m --seq-len 2048 "${long[@]}"
bench fused_2 --models kla_45m,gpt_45m --seq-len 2048 "${long[@]}" --override optim.fused=true
bench profile_45m_compile --models kla_45m,gpt_45m --seq-len 2048 --profile
bench lm_45m_long --models kla_45m,gpt_45m --seq-lens 8192,16384,32768 --steps 40 --log-every 10
bench lm_180m_2048 --models kla_180m,gpt_180m --seq-len 2048 --steps 40 --log-every 10
echo "== end $(date +%T)"
