# For a GPU session (written 2026-12-05, fortieth session), one device call (carry `.whl`; about 6-7 minutes):
# do the length tables' rows after a process's first T, which ran dynamic-shape recompiles until b7ef2af, read
# lower or higher than a static compile? gpt_45m and kla_45m at T 2048 then 8192 in one process, with c277fd1's
# bench_lm.py (the T 8192 rows recompile with the batch and length dynamic) and with this tree's (every run compiled
# afresh, static); compile on, 32,768 tokens a step, the mean of the last 10 of 40 steps.
#   bash results/cpu_2026-12-05/static_dynamic_call.sh     # then unpack $OUT/static_dynamic.tgz into results/gpu_<date>
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/sd
git show c277fd1:scripts/bench_lm.py > scripts/bench_lm_c277fd1.py || exit 1  # beside it: the same imports
for variant in dynamic:scripts/bench_lm_c277fd1.py static:scripts/bench_lm.py; do
  IFS=: read -r name script <<< "$variant"
  timeout -k 10 270 python3 "$script" --models gpt_45m,kla_45m --seq-lens 2048,8192 --tokens-per-step 32768 \
    --compile on --steps 40 --log-every 10 --out /tmp/sd/$name.md > /tmp/sd/$name.log 2>&1
  echo "$name: rc $? at ${SECONDS} s"
  tar -czf $OUT/static_dynamic.tgz -C /tmp sd
done
rm -f scripts/bench_lm_c277fd1.py
grep -h "^| [a-z_]*_[0-9]*m \|^| [0-9]* |" /tmp/sd/*.md
