# Written in the twelfth session; PART 1's 45M rows ran in the thirteenth (results/gpu_2026-12-02d, call 4): the rest of #17's whole-LM table (docs/benchmarks.md, "Twelfth
# session", has kla/gpt at 45M for T 2048-32768, mamba/gpt_kla at 45M for T 2048 and kla/gpt at 180M for T 2048).
# Compile on, 32,768 tokens a step, 40 steps with the last 10 timed, as that table's long-T rows. One device call per
# PART (carry `.whl`; each about 5-9 minutes by the twelfth session's wall times of 10-54 s a run plus compiling):
#   PART=1  45M: mamba_45m and gpt_kla_45m at T 8192, 16384, 32768; 180M: mamba_180m and gpt_kla_180m at T 2048
#   PART=2  180M: kla, gpt, mamba, gpt_kla at T 8192 and 16384
#   PART=3  180M: kla, gpt, mamba, gpt_kla at T 32768
# Everything comes back as table_rest_<PART>.tgz, rewritten after every run. Then, here: `bench_lm.py --merge` of the
# .json files with this session's (results/gpu_2026-12-02c/lm_45m_2048.json, lm_45m_long.json, lm_180m_2048.json)
# and `--plot`.
source scripts/device_setup.sh || exit 1
part=${PART:-1}
mkdir -p /tmp/tr
bench() { local name=$1; shift; echo "== $name $(date +%T)"
  python3 scripts/bench_lm.py --tokens-per-step 32768 --compile on --steps 40 --log-every 10 "$@" \
    --out /tmp/tr/$name.md 2>&1 | tail -12 | tee /tmp/tr/$name.log; tar -czf $OUT/table_rest_$part.tgz -C /tmp/tr .; }
case $part in
  1) bench rest_45m_long --models mamba_45m,gpt_kla_45m --seq-lens 8192,16384,32768
     bench rest_180m_2048 --models mamba_180m,gpt_kla_180m --seq-len 2048 ;;
  1b) bench rest_180m_2048 --models mamba_180m,gpt_kla_180m --seq-len 2048 ;;  # PART 1's second half (not reached)
  2) bench rest_180m_mid --models kla_180m,gpt_180m,mamba_180m,gpt_kla_180m --seq-lens 8192,16384 ;;
  3) bench rest_180m_32k --models kla_180m,gpt_180m,mamba_180m,gpt_kla_180m --seq-len 32768 ;;
  *) echo "PART must be 1, 2 or 3"; exit 2 ;;
esac
echo "== end $(date +%T)"
