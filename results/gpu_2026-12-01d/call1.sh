# GPU call 1 of 2026-12-01 (fourth session): bf16 split slots against main, then the kernel GPU tests
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/split && cp kernels/common.py kernels/mobius_scan_fwd.py kernels/mobius_scan_bwd.py /tmp/split/
run() { echo "== $1 $(date +%T)"; python3 kernels/bench_scan.py --dtypes 2>&1 | tee $OUT/dtypes_$1.md | tail -14; }
run split_a
cp .carry/main_kernels/*.py kernels/ && run main_a
cp /tmp/split/*.py kernels/ && run split_b
cp .carry/main_kernels/*.py kernels/ && run main_b
cp /tmp/split/*.py kernels/
echo "== gpu tests $(date +%T)"
timeout 230 python3 -m pytest tests/kernels -m gpu -s -q -p no:cacheprovider 2>&1 | tee $OUT/gpu_kernel_tests.log | tail -30
echo "== end $(date +%T)"
