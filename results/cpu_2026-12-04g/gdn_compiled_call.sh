# For the next GPU session (written 2026-12-04, thirty-second session), one device call (carry `.whl`; about 9
# minutes): the GDN models compiled, which results/gpu_2026-12-04g could not time because the fla probe failed under
# Lightning's `torch.device(root)` (fixed since). First the GPU test of that probe, then gdn_45m and gdn_180m with
# train.compile=true (one graph) and =blocks (each block alone), B16 × T2048, 32,768 tokens a step, each under
# `timeout -k` (the bench stops at SIGTERM since the thirty-second session, even while compiling; -k stays as a
# backstop), after both eager (compile off): the torch path
# has run about a fifth fewer kernels since results/cpu_2026-12-04g/gdn_path_ab.md, whose eager rows before that
# are gdn/ of results/gpu_2026-12-04g (179,590 and 52,749 tokens/s). A cold inductor compile of gdn_45m's step took 98 s on 2
# CPU cores (results/cpu_2026-12-04e/gdn_compile_time.md), 36.8 s by blocks (results/cpu_2026-12-04f).
#   bash results/cpu_2026-12-04g/gdn_compiled_call.sh     # then unpack $OUT/gdn_compiled.tgz into results/gpu_<date>
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/gdn_compiled
timeout -k 10 90 python3 -m pytest -q -m gpu tests/ops/test_gdn.py -k probe > /tmp/gdn_compiled/test.log 2>&1
echo "probe test: rc $? at ${SECONDS} s"
for run in gdn_45m:off:45 gdn_180m:off:60 gdn_45m:blocks:110 gdn_45m:on:150 gdn_180m:blocks:120 gdn_180m:on:150; do
  IFS=: read -r model mode limit <<< "$run"
  [ $((${LIMIT:-570} - SECONDS - 10)) -lt $limit ] && { echo "$model compile $mode: skipped, no time left"; continue; }
  timeout -k 10 $limit python3 scripts/bench_lm.py --models $model --seq-len 2048 --tokens-per-step 32768 \
    --compile $mode --out /tmp/gdn_compiled/${model}_$mode.md > /tmp/gdn_compiled/${model}_$mode.log 2>&1
  echo "$model compile $mode: rc $? at ${SECONDS} s"
  tar -czf $OUT/gdn_compiled.tgz -C /tmp gdn_compiled
done
grep -h "^| gdn" /tmp/gdn_compiled/*.md
