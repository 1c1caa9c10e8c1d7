# Written in the thirteenth session, not run yet (its device time was spent): one device call, about 6-7 minutes,
# carry `.whl`. Returns one archive, next_call.tgz, rewritten after every run so a call stopped by its limit still
# returns what finished.
# 1. The GPU test of the sync-free step: fused AdamW skips a bad step from its flag on the device, the host reads the
#    flag a step later (waiting for the flag's copy alone, not for the work queued after it); foreach AdamW reads it
#    in the step. Same skipped steps, same losses (bf16 tolerance).
# 2. Three interleaved rounds at T 2048 (compile on, 32,768 tokens a step, 100 steps, the last 50 timed): the
#    default foreach AdamW (one host synchronisation a step) against fused AdamW (none). The thirteenth session
#    measured 9-24 % between two runs of one tree, so the rounds and their spread are the result, not one pair.
# 3. The compiled step's profile with fused AdamW: is the GPU's idle time at the step boundary gone?
# Beside them, nvidia-smi samples the SM and memory clocks, power and temperature (gpu_clocks.csv), and each bench table
# gives its runs' median and slowest step: is the noise a few slow steps, or slower clocks?
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/nc
# the GPU's clocks, power and temperature twice a second for the whole call: do runs of one tree differ by clocks?
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 500 > /tmp/nc/gpu_clocks.csv 2>&1 &
# stop the sampler when the script ends: left running, it held the fourteenth session's call open to its 600 s limit
trap 'kill %1 2>/dev/null; tar -czf $OUT/next_call.tgz -C /tmp/nc .' EXIT
timeout 150 python3 -m pytest -q -m gpu tests/train/test_app.py tests/train/test_divergence.py -p no:cacheprovider \
  -k "non_finite or host_flag or all_finite" 2>&1 | tail -2 \
  | tee /tmp/nc/tests_skip_gpu.log
bench() { local name=$1; shift; echo "== $name $(date +%T)"
  python3 scripts/bench_lm.py --seq-len 2048 --tokens-per-step 32768 --compile on "$@" --out /tmp/nc/$name.md 2>&1 \
    | tail -7 | tee /tmp/nc/$name.log; tar -czf $OUT/next_call.tgz -C /tmp/nc .; }
for r in 1 2 3; do
  bench foreach_$r --models kla_45m,gpt_45m --steps 100 --log-every 50
  bench fused_$r --models kla_45m,gpt_45m --steps 100 --log-every 50 --override optim.fused=true
done
bench profile_fused --models kla_45m,gpt_45m --profile --override optim.fused=true
echo "== end $(date +%T)"
