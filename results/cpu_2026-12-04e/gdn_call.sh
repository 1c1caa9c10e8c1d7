# For the next GPU session (written 2026-12-04, thirty-first session), one device call (carry `.whl`; about 9
# minutes). GDN's torch path passes the state between chunks in groups of about √N chunks since the thirty-first
# session (src/klalm/ops/gdn.py `_chunk_states`); before, a log-depth scan (94ea0e4: gdn_45m 1.66× the loop's speed
# eager on one H200, gdn_180m 0.77×, results/gpu_2026-12-04f/gdn), and before that a loop over chunks (397be0f).
# 1. gdn_180m and gdn_45m eager with each of the three (the older two from git: 397be0f, 94ea0e4), every row with
#    the allocator's reserved memory and retries (perf/peak_reserved_gb, perf/alloc_retries); gdn_180m with the
#    groups and with the scan profiled in runs of their own (every kernel of one step beside the table).
# 2. gdn_45m compiled with the groups, with room to compile (about 2 minutes cold through inductor on 2 CPU cores:
#    gdn_compile_time.md), then gdn_180m with the time left, compiled by blocks (train.compile=blocks, since the
#    thirty-first session: its ten identical blocks compile once; results/cpu_2026-12-04f).
# Every bench runs under `timeout -k`: the bench ignores the first SIGTERM while it compiles (Lightning's handler
# waits for the step to end), which cost results/gpu_2026-12-04f a whole call.
#   bash results/cpu_2026-12-04e/gdn_call.sh        # then unpack $OUT/gdn.tgz into a results/gpu_<date> folder
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
cp src/klalm/ops/gdn.py /tmp/gdn_groups.py
for pass in groups loop scan; do
  case $pass in
    loop) git show 397be0f:src/klalm/ops/gdn.py > src/klalm/ops/gdn.py || exit 1 ;;
    scan) git show 94ea0e4:src/klalm/ops/gdn.py > src/klalm/ops/gdn.py || exit 1 ;;
  esac
  bench gdn_180m off 60 eager_$pass
  bench gdn_45m off 45 eager_$pass
  # a profiled run apart: the profiler's step and its export fall inside the timed steps, so its tokens/s are not
  # comparable (the loop's profile is left out for time)
  [ $pass != loop ] && bench gdn_180m off 60 profile_$pass --profile
done
cp /tmp/gdn_groups.py src/klalm/ops/gdn.py && git diff --quiet src/klalm/ops/gdn.py || exit 1
bench gdn_45m on 200 compiled
left=$((${LIMIT:-570} - SECONDS - 15))
[ $left -gt 90 ] && bench gdn_180m blocks $left compiled_blocks  # each block compiled alone: one compile, not ten
grep -h "^| gdn" /tmp/gdn/*.md
