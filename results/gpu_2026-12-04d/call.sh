# Thirtieth session (2026-12-04), one device call (carry `.whl`): torch.compile off and on for gdn_180m and gdn_45m
# after bc6eef0 (the torch GDN path's loop over chunks runs eagerly under compile, so dynamo no longer unrolls it;
# gdn_180m's compiled run of results/gpu_2026-12-04b was still compiling at its 165 s timeout), each model in its own
# process under its own timeout, at the compile table's shape (T 2048, 32,768 tokens a step; GDN on klalm's torch
# path: fla's gated backward needs triton >= 3.7.1); then, with the time left, the synthetic trainer's gdn rows
# through inductor (what results/gpu_2026-12-04b's call did not reach).
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "setup done at ${SECONDS} s"
for spec in gdn_180m:150 gdn_45m:90; do
  model=${spec%%:*}
  timeout ${spec#*:} python3 scripts/bench_lm.py --models $model --seq-len 2048 --tokens-per-step 32768 --compile both \
    --out $OUT/lm_compile_$model.md > $OUT/lm_compile_$model.log 2>&1
  echo "$model: rc $? at ${SECONDS} s"
done
left=$((${LIMIT:-350} - SECONDS))
if [ $left -gt 45 ]; then
  timeout $left python3 scripts/bench_synthetic.py --archs gdn --depths 1,2 --members 3 --procs 1 \
    --compile inductor > $OUT/bench_synthetic_inductor_gdn.md 2>&1
  echo "synthetic gdn: rc $? at ${SECONDS} s"
fi
