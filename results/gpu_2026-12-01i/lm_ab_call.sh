# A device call written in the ninth session of 2026-12-01 for the next GPU session (not yet run; carry `.whl`).
# Does the selective scan's kernel gain show in a Mamba model's training step? At the Mamba layer's shape its
# forward+backward went from 4.152 ms (ebd48a9) to 3.001 ms (HEAD), six layers, so about 6.9 ms of mamba_45m's
# 83.6 ms step; one run of mamba_45m in the ninth session was within noise of the fifth session's. So: mamba_45m at
# T = 2048, compile on, twice on the committed tree and twice with the selective scan of ebd48a9
# (ss_ebd48a9.patch, applied and reverted), alternating, then the step profile (20 largest kernels) of mamba_45m,
# kla_45m and gpt_45m with compile on. Outputs go to one archive, $OUT/lm_ab.tar (bench_lm writes two files a run).
source scripts/device_setup.sh || exit 1
patch=results/gpu_2026-12-01i/ss_ebd48a9.patch
mkdir -p /tmp/lm_ab
lm() {  # lm NAME: one mamba_45m row into /tmp/lm_ab/NAME.{md,json,log}
  echo "== $1 $(date +%T)"
  timeout 150 python3 scripts/bench_lm.py --models mamba_45m --seq-len 2048 --tokens-per-step 32768 --compile on \
    --out /tmp/lm_ab/$1.md > /tmp/lm_ab/$1.log 2>&1
  grep '^| mamba_45m' /tmp/lm_ab/$1.md
}
for round in 1 2; do
  lm head_$round
  git apply $patch && { lm ebd48a9_$round; git apply -R $patch; }
done
echo "== profile $(date +%T)"
timeout 300 python3 scripts/bench_lm.py --models mamba_45m,kla_45m,gpt_45m --seq-len 2048 --tokens-per-step 32768 \
  --profile --compile on --out /tmp/lm_ab/profile_45m_compile_top.md > /tmp/lm_ab/profile.log 2>&1
tail -4 /tmp/lm_ab/profile.log
tar -cf $OUT/lm_ab.tar -C /tmp/lm_ab .
echo "== end $(date +%T)"
