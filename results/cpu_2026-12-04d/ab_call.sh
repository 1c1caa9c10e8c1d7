# For the next GPU session (written 2026-12-04, thirtieth session), one device call (carry `.whl`): whole-LM tokens/s
# with torch.compile on, gpt_45m and kla_45m, with every LM compiled as one graph (65ca32e, this tree) against the
# tree before it (`one_graph.patch` reversed: 38 graphs a gpt_45m forward, 44 a kla_45m one, on the CPU). Three
# processes in the order after, before, after (each: both models, one run each), at the compile table's shape
# (T 2048, 32,768 tokens a step). Everything lands in /tmp/ab/, packed into $OUT/ab.tgz after every process (a call
# returns at most 8 files).
#   bash results/cpu_2026-12-04d/ab_call.sh
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/ab
patch=results/cpu_2026-12-04d/one_graph.patch
for run in after_1 before_1 after_2; do
  [ "${run%_*}" = before ] && { git apply -R $patch || exit 1; }
  timeout 160 python3 scripts/bench_lm.py --models gpt_45m,kla_45m --seq-len 2048 --tokens-per-step 32768 \
    --compile on --out /tmp/ab/lm_$run.md > /tmp/ab/lm_$run.log 2>&1
  echo "$run: rc $? at ${SECONDS} s"
  [ "${run%_*}" = before ] && { git apply $patch || exit 1; }
  tar -czf $OUT/ab.tgz -C /tmp ab
done
