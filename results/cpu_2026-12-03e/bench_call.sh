# Written in the twenty-first session (2026-12-03) for a GPU session; not run yet. One device call (carry `.whl`),
# about 8 minutes, two measurements never taken:
# 1. the synthetic trainer's steps/s table (issue 18: all four archs at 1 and 2 blocks) through inductor, as the full
#    plan trains since 2026-12-01 (only kla and gpt at one block were measured compiled; docs/synthetic.md);
# 2. torch.compile off and on for the three 180M models whose experiment configs leave it off because it was never
#    measured (docs/benchmarks.md, "Compile for every model"): mamba_180m, gpt_kla_180m and gdn_180m (GDN on
#    klalm's torch path: fla's gated backward needs triton >= 3.7.1, the image has 3.6), at the compile table's
#    shape (T 2048, 32,768 tokens a step). Then, here: where "on" is faster, `train.compile: true` in
#    configs/experiment/<model>.yaml with the measured ratio, as the 45M configs have it.
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 200 python3 scripts/bench_synthetic.py --archs kla,gpt,mamba,gdn --depths 1,2 --side-archs kla --members 3 \
  --procs 1 --compile inductor 2>&1 | tee $OUT/bench_synthetic_inductor.md
timeout 330 python3 scripts/bench_lm.py --models mamba_180m,gpt_kla_180m,gdn_180m --seq-len 2048 \
  --tokens-per-step 32768 --compile both --out $OUT/lm_180m_compile_rest.md
