start=$(date +%s)
D2_LENGTHS=20 MARGIN=0 timeout 450 bash .carry/a5_call.sh_inner 2>&1 | tail -8
export PYTHONPATH=$PWD/.site PYTHONUNBUFFERED=1
left() { echo $(( 585 - ($(date +%s) - start) )); }
echo "== #17 dtypes main, $(left)s left"
timeout $(left) python3 kernels/bench_scan.py --dtypes 2>&1 | tee $OUT/dtypes_main.md | tail -16
git apply results/gpu_2026-12-01d/bf16_split_slots.patch && echo "== dtypes split, $(left)s left" \
  && timeout $(left) python3 kernels/bench_scan.py --dtypes 2>&1 | tee $OUT/dtypes_split.md | tail -16
git apply -R results/gpu_2026-12-01d/bf16_split_slots.patch
echo "== end $(( $(date +%s) - start ))s"
