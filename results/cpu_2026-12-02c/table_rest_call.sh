# Written in the twelfth session; PART 1's 45M rows ran in the thirteenth (results/gpu_2026-12-02d, call 4): the rest of #17's whole-LM table (docs/benchmarks.md, "Twelfth
# session", has kla/gpt at 45M for T 2048-32768, mamba/gpt_kla at 45M for T 2048 and kla/gpt at 180M for T 2048).
# Compile on, 32,768 tokens a step, 40 steps with the last 10 timed, as that table's long-T rows. One device call per
# PART (carry `.whl`; each about 5-9 minutes by the twelfth session's wall times of 10-54 s a run plus compiling):
#   PART=1  45M: mamba_45m and gpt_kla_45m at T 8192, 16384, 32768; 180M: mamba_180m and gpt_kla_180m at T 2048
#   PART=2, 3, 4  180M: kla, gpt, mamba, gpt_kla at T 8192, 16384, 32768 (one T each; PART="2 3" runs two in one call)
# Everything comes back as table_rest.tgz, rewritten after every `bench` (PART 1 and 1b ran before the fourteenth
# session's change to the parts; they wrote table_rest_<PART>.tgz). Then, here: `bench_lm.py --merge` of the
# .json files with this session's (results/gpu_2026-12-02c/lm_45m_2048.json, lm_45m_long.json, lm_180m_2048.json)
# and `--plot`.
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/tr
# optim.fused=false: every row of the table so far ran with foreach AdamW (the default until the fourteenth session;
# fused is 1.16-1.19x faster for both kla_45m and gpt_45m at T 2048, results/gpu_2026-12-02e), so the rest does too.
bench() { local name=$1; shift; echo "== $name $(date +%T)"
  python3 scripts/bench_lm.py --tokens-per-step 32768 --compile on --steps 40 --log-every 10 \
    --override optim.fused=false "$@" --out /tmp/tr/$name.md 2>&1 | tail -14 | tee /tmp/tr/$name.log
  tar -czf $OUT/table_rest.tgz -C /tmp/tr .; }
ALL180=kla_180m,gpt_180m,mamba_180m,gpt_kla_180m
for part in ${PART:-1}; do  # PART="2 3": both in one call
  case $part in
    1) bench rest_45m_long --models mamba_45m,gpt_kla_45m --seq-lens 8192,16384,32768
       bench rest_180m_2048 --models mamba_180m,gpt_kla_180m --seq-len 2048 ;;
    1b) bench rest_180m_2048 --models mamba_180m,gpt_kla_180m --seq-len 2048 ;;  # ran in the fourteenth session
    2) bench rest_180m_8k --models $ALL180 --seq-len 8192 ;;  # about 4 minutes (estimated)
    3) bench rest_180m_16k --models $ALL180 --seq-len 16384 ;;
    4) bench rest_180m_32k --models $ALL180 --seq-len 32768 ;;
    *) echo "PART must be 1, 1b, 2, 3 or 4"; exit 2 ;;
  esac
done
echo "== end $(date +%T)"
