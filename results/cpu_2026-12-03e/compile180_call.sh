# Written in the twenty-first session (2026-12-03) for a GPU session; not run yet. One device call (carry `.whl`),
# about 5 minutes: torch.compile off and on for the three 180M models whose experiment configs leave it off because
# it was never measured (docs/benchmarks.md, "Compile for every model"): mamba_180m, gpt_kla_180m and gdn_180m (GDN
# on klalm's torch path: fla's gated backward needs triton >= 3.7.1, the image has 3.6). The same shape as the
# compile table's other rows (T 2048, 32,768 tokens a step). Then, here: where "on" is faster, `train.compile: true`
# in configs/experiment/<model>.yaml with the measured ratio, as the 45M configs have it.
source scripts/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 540 python3 scripts/bench_lm.py --models mamba_180m,gpt_kla_180m,gdn_180m --seq-len 2048 \
  --tokens-per-step 32768 --compile both --out $OUT/lm_180m_compile_rest.md
