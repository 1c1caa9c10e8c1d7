# Twenty-ninth session (2026-12-04), one device call (carry `.whl`): the retry of results/cpu_2026-12-03e/bench_call.sh,
# whose one call ran past the 600 s limit with nothing written but the synthetic table (bench_lm writes its table at
# the end, and all three 180M models ran in one process). Here each model runs in its own process under its own
# timeout and writes its own file, so a slow compile loses one model, not three: torch.compile off and on for
# mamba_180m, gpt_kla_180m and gdn_180m (GDN on klalm's torch path: fla's gated backward needs triton >= 3.7.1) at the
# compile table's shape (T 2048, 32,768 tokens a step); then, with the time left, the synthetic trainer's gdn rows
# through inductor (the only arch that call's 200 s did not reach).
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "setup done at ${SECONDS} s"
for model in mamba_180m gpt_kla_180m gdn_180m; do
  timeout 165 python3 scripts/bench_lm.py --models $model --seq-len 2048 --tokens-per-step 32768 --compile both \
    --out $OUT/lm_180m_compile_$model.md > $OUT/lm_180m_compile_$model.log 2>&1
  echo "$model: rc $? at ${SECONDS} s"
done
left=$((560 - SECONDS))
if [ $left -gt 60 ]; then
  timeout $left python3 scripts/bench_synthetic.py --archs gdn --depths 1,2 --members 3 --procs 1 \
    --compile inductor > $OUT/bench_synthetic_inductor_gdn.md 2>&1
  echo "synthetic gdn: rc $? at ${SECONDS} s"
fi
