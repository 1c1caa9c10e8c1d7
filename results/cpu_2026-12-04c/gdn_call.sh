# For the next GPU session (written 2026-12-04, thirtieth session), one device call (carry `.whl`): the GDN models
# with the log-depth state scan (results/cpu_2026-12-04c) against the loop over chunks it replaced, on one H200.
# 1. HEAD (the scan), gdn_45m and gdn_180m, torch.compile off and on (T 2048, 32,768 tokens a step), each model in its
#    own process under its own timeout, so a slow compile loses one model.
# 2. 397be0f's src/klalm/ops/gdn.py (the loop; it compiles unrolled and slowly, so eager only): the eager A/B of the
#    state pass itself. The file is put back afterwards.
# 3. With the time left: the synthetic trainer's gdn rows through inductor (results/gpu_2026-12-04d stopped at 142 s,
#    still compiling, with the loop as a graph break).
#   bash results/cpu_2026-12-04c/gdn_call.sh        # then copy $OUT's files into a results/gpu_<date> folder
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "setup done at ${SECONDS} s"
bench() {  # model, compile, timeout, tag
  timeout $3 python3 scripts/bench_lm.py --models $1 --seq-len 2048 --tokens-per-step 32768 --compile $2 \
    --out $OUT/lm_$4_$1.md > $OUT/lm_$4_$1.log 2>&1
  echo "$4 $1 compile $2: rc $? at ${SECONDS} s"
}
bench gdn_45m both 120 scan
bench gdn_180m both 150 scan
cp src/klalm/ops/gdn.py /tmp/gdn_scan.py && git show 397be0f:src/klalm/ops/gdn.py > src/klalm/ops/gdn.py
bench gdn_45m off 60 loop
bench gdn_180m off 60 loop
cp /tmp/gdn_scan.py src/klalm/ops/gdn.py
left=$((${LIMIT:-560} - SECONDS))
if [ $left -gt 60 ]; then
  timeout $left python3 scripts/bench_synthetic.py --archs gdn --depths 1,2 --members 3 --procs 1 \
    --compile inductor > $OUT/bench_synthetic_inductor_gdn.md 2>&1
  echo "synthetic gdn: rc $? at ${SECONDS} s"
fi
