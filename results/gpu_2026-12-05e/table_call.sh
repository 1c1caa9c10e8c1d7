# The rest of issue 17's compiled whole-LM table after results/cpu_2026-12-04e/table_call.sh's first call
# (PART=45m; its 130 s a model left kla_45m one length: each length compiles anew, about 50 s for kla_45m).
# RUNS holds one run a line, "models lengths limit_s"; each run is one bench_lm process under `timeout -k`,
# compile on, 32,768 tokens a step, the mean of the last 10 of 40 steps. Carry `.whl`.
#   RUNS=$'kla_45m 8192,16384,32768 240\nmamba_45m,gpt_kla_45m 32768 150' bash results/gpu_2026-12-05e/table_call.sh
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/lm
while read -r models lens limit; do
  [ -z "$models" ] && continue
  name=${models//,/+}_${lens//,/+}
  timeout -k 10 "$limit" python3 scripts/bench_lm.py --models "$models" --seq-lens "$lens" \
    --tokens-per-step 32768 --compile on --steps 40 --log-every 10 --out "/tmp/lm/$name.md" > "/tmp/lm/$name.log" 2>&1
  echo "$models at $lens: rc $? at ${SECONDS} s"
  tar -czf "$OUT/lm_table.tgz" -C /tmp lm
done <<< "${RUNS:?RUNS: one run a line, \"models lengths limit_s\"}"
grep -h "^| [a-z_]*_[0-9]*m " /tmp/lm/*.md
