source scripts/device_setup.sh >/dev/null 2>&1 || exit 1
for n in 1 3; do git apply .carry/bf16/bf16_candidate_$n.patch && python3 kernels/bench_scan.py --dtypes > $OUT/dtypes_c$n.md 2>&1; git apply -R .carry/bf16/bf16_candidate_$n.patch; done
python3 kernels/bench_scan.py --dtypes > $OUT/dtypes_main.md 2>&1
