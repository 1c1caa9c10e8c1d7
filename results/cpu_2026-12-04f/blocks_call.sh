# For a GPU session (written 2026-12-04, thirty-first session), one device call (carry `.whl`; about 9 minutes):
# train.compile=blocks (each backbone block compiled on its own; identical blocks share one graph) against
# train.compile=true (the whole model as one graph), T 2048, 32,768 tokens a step, one process per model and
# setting under `timeout -k`: tokens/s, and the compile time from each run's wall seconds. On the CPU blocks
# compiled gdn_45m in less than half the time at the same step time (compile_blocks.md); the GPU decides whether
# the experiments should use it.
#   bash results/cpu_2026-12-04f/blocks_call.sh      # then unpack $OUT/blocks.tgz into a results/gpu_<date> folder
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/blocks
for model in kla_45m gpt_45m kla_180m gpt_180m; do
  for mode in blocks on; do
    timeout -k 10 100 python3 scripts/bench_lm.py --models $model --seq-len 2048 --tokens-per-step 32768 \
      --compile $mode --out /tmp/blocks/${model}_$mode.md > /tmp/blocks/${model}_$mode.log 2>&1
    echo "$model compile $mode: rc $? at ${SECONDS} s"
    tar -czf $OUT/blocks.tgz -C /tmp blocks
  done
done
grep -h "^| [a-z_]*_[0-9]*m " /tmp/blocks/*.md
