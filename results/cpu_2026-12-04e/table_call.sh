# For the next GPU session (written 2026-12-04, thirty-first session): issue 17's whole-LM table with every model
# compiled as one graph (since 65ca32e; results/gpu_2026-12-04f/ab measured +5 % for gpt_45m and kla_45m at T 2048,
# kla / gpt unchanged at 0.61). Compile on, 32,768 tokens a step (B·T fixed), T 2048, 8192, 16384 and 32768, the
# mean of the last 10 of 40 steps, one process per model under `timeout -k` (a compile that hangs loses one model,
# not the call). Three calls (carry `.whl`), about 7–9 minutes each:
#   PART=45m bash results/cpu_2026-12-04e/table_call.sh            # gpt, kla, mamba, gpt_kla at 45M; then, with the
#                                                                  # time left, one compiled step of kla_45m and
#                                                                  # gpt_45m profiled (--profile)
#   PART=180m_a bash results/cpu_2026-12-04e/table_call.sh         # gpt_180m, kla_180m
#   PART=180m_b bash results/cpu_2026-12-04e/table_call.sh         # mamba_180m, gpt_kla_180m
# Everything lands in /tmp/lm, packed into $OUT/lm_table_$PART.tgz after each model (a call returns at most 8
# files). Afterwards: `python3 scripts/bench_lm.py --merge <the .json files> --plot docs/img/lm_sweep_compiled.png`.
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
case ${PART:?PART=45m, 180m_a or 180m_b} in
  45m) models="gpt_45m kla_45m mamba_45m gpt_kla_45m"; limit=130 ;;
  180m_a) models="gpt_180m kla_180m"; limit=250 ;;
  180m_b) models="mamba_180m gpt_kla_180m"; limit=250 ;;
  *) echo "table_call.sh: unknown PART=$PART (45m, 180m_a or 180m_b)" >&2; exit 1 ;;
esac
mkdir -p /tmp/lm
for model in $models; do
  timeout -k 10 $limit python3 scripts/bench_lm.py --models $model --seq-lens 2048,8192,16384,32768 \
    --tokens-per-step 32768 --compile on --steps 40 --log-every 10 --out /tmp/lm/$model.md > /tmp/lm/$model.log 2>&1
  echo "$model: rc $? at ${SECONDS} s"
  tar -czf $OUT/lm_table_$PART.tgz -C /tmp lm
done
if [ "$PART" = 45m ]; then  # issue 17's "after" profile of one compiled step, with the time left
  left=$((${LIMIT:-570} - SECONDS - 15))
  if [ $left -gt 60 ]; then
    timeout -k 10 $left python3 scripts/bench_lm.py --models kla_45m,gpt_45m --seq-len 2048 \
      --tokens-per-step 32768 --compile on --profile --out /tmp/lm/profile_45m.md > /tmp/lm/profile_45m.log 2>&1
    echo "profile: rc $? at ${SECONDS} s"
    tar -czf $OUT/lm_table_$PART.tgz -C /tmp lm
  fi
fi
grep -h "^| [a-z_]*_[0-9]*m " /tmp/lm/*.md
