# For the next GPU session (written 2026-12-04, thirty-first session), one device call (carry `.whl`; about 9
# minutes): why GDN's log-depth state scan made gdn_180m 0.77x the loop's speed eager while gdn_45m gained 1.66x
# (results/gpu_2026-12-04f/gdn), and how fast the scan runs compiled.
# 1. gdn_180m eager, scan (HEAD) then loop (397be0f's src/klalm/ops/gdn.py), each with --profile (every kernel of one
#    step beside the table) and the allocator's reserved memory and retries (perf/peak_reserved_gb,
#    perf/alloc_retries, since the thirty-first session).
# 2. gdn_45m compiled with the scan, with room to compile (about 100 s on 2 CPU cores through inductor:
#    results/cpu_2026-12-04e/gdn_compile_time.md; the 120 s limit of results/gpu_2026-12-04f stopped it after one step).
# 3. gdn_180m compiled with the scan, with the time left.
# Every bench runs under `timeout -k`: the bench ignores the first SIGTERM while it compiles (Lightning's handler
# waits for the step), which cost results/gpu_2026-12-04f a whole call.
#   bash results/cpu_2026-12-04e/gdn_call.sh        # then copy $OUT's files into a results/gpu_<date> folder
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "setup done at ${SECONDS} s"
mkdir -p /tmp/gdn
bench() {  # model, compile, timeout, tag, extra options; everything lands in /tmp/gdn, packed into $OUT/gdn.tgz after
           # each run (a call returns at most 8 files)
  timeout -k 10 $3 python3 scripts/bench_lm.py --models $1 --seq-len 2048 --tokens-per-step 32768 --compile $2 $5 \
    --out /tmp/gdn/$4_$1.md > /tmp/gdn/$4_$1.log 2>&1
  echo "$4 $1 compile $2: rc $? at ${SECONDS} s"
  tar -czf $OUT/gdn.tgz -C /tmp gdn
}
bench gdn_180m off 75 scan --profile
cp src/klalm/ops/gdn.py /tmp/gdn_scan.py && git show 397be0f:src/klalm/ops/gdn.py > src/klalm/ops/gdn.py
bench gdn_180m off 75 loop --profile
cp /tmp/gdn_scan.py src/klalm/ops/gdn.py && git diff --quiet src/klalm/ops/gdn.py || exit 1
bench gdn_45m on 240 compiled
left=$((${LIMIT:-570} - SECONDS - 15))
[ $left -gt 90 ] && bench gdn_180m on $left compiled
grep -h "^| gdn" /tmp/gdn/*.md
