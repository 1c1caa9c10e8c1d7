# Written in the twelfth session, run in the thirteenth (results/gpu_2026-12-02d, call 1, 366 s): one device call, carry
# `.whl`. Returns one archive, next_call.tgz, rewritten after every run so a call stopped by its limit still returns
# what finished.
# 1. The GPU tests of the finiteness check (one max-norm over the parameters; NaN must propagate on CUDA).
# 2. Two rounds of an A/B at T 2048 (compile on, 32,768 tokens a step, 60 steps, the last 20 timed): HEAD;
#    HEAD without this session's three host-side changes (`git apply -R host_changes.patch`: the finiteness check
#    per parameter, Lightning's `self.log` in every step and pageable batches come back); HEAD with
#    `sensors_one_matmul.patch`
#    (the KLA layer's maps that read z as one matmul; kla_45m only).
# 3. The compiled step's profile on HEAD, with the GPU's idle time and what the host ran then (new in 5dacff0), and
#    kla_45m's with fused AdamW (5-9 % slower in the twelfth session, unexplained: its kernels take about 1.2 ms).
source scripts/device_setup.sh || exit 1
P=results/cpu_2026-12-02c
mkdir -p /tmp/nc
timeout 90 python3 -m pytest -q -m gpu tests/train/test_divergence.py -p no:cacheprovider 2>&1 | tail -2 \
  | tee /tmp/nc/tests_divergence_gpu.log
bench() { local name=$1; shift; echo "== $name $(date +%T)"
  python3 scripts/bench_lm.py --seq-len 2048 --tokens-per-step 32768 --compile on "$@" --out /tmp/nc/$name.md 2>&1 \
    | tail -7 | tee /tmp/nc/$name.log; tar -czf $OUT/next_call.tgz -C /tmp/nc .; }
for r in 1 2; do
  bench head_$r --models kla_45m,gpt_45m --steps 60 --log-every 20
  git apply -R $P/host_changes.patch && bench host_reverted_$r --models kla_45m,gpt_45m --steps 60 --log-every 20
  git apply $P/host_changes.patch
  git apply $P/sensors_one_matmul.patch && bench sensors_$r --models kla_45m --steps 60 --log-every 20
  git apply -R $P/sensors_one_matmul.patch
done
bench profile_head --models kla_45m,gpt_45m --profile
bench profile_fused_adamw --models kla_45m --profile --override optim.fused=true  # why fused AdamW was slower
echo "== end $(date +%T)"
