# Written in the fifteenth session, not run yet: one device call (carry `.whl`; at most about 8 minutes, every step
# under its own `timeout`) for what this session merged without a GPU run of its own:
# 1. the kernel GPU tests on main (`tests/kernels -m gpu`): the two merged backward kernels (the fifteenth session's
#    call cut their tests at 120 s after six passed) and the wide-state launch configs (test_gpu_large_state_default,
#    S 32 and 64 against the float64 reference);
# 2. the finiteness check's GPU tests (the parameters now reach the norm detached);
# 3. the scan headline after the merges (`bench_scan.py --skip-torch`; ca6ca19, before them: 0.567 / 2.584 ms).
# (The kernel GPU tests took 169-253 s for 12 tests in earlier sessions; two more now.) MAD's new GPU test, six tasks
# captured through inductor against eager (MAD has not run on a GPU), is a call of its own, about 3 minutes:
#   source scripts/device_setup.sh; timeout 200 python3 -m pytest -q -m gpu tests/tasks/test_graph.py -k mad -rA
# Everything comes back in next_call.tgz, rewritten after each step and when the script exits.
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/nc
trap 'tar -czf $OUT/next_call.tgz -C /tmp/nc .' EXIT
step() { local name=$1 limit=$2; shift 2; echo "== $name $(date +%T)"
  timeout "$limit" "$@" > /tmp/nc/$name.log 2>&1; echo "rc $? $(date +%T)" >> /tmp/nc/$name.log
  tail -6 /tmp/nc/$name.log; tar -czf $OUT/next_call.tgz -C /tmp/nc .; }
step tests_kernels_gpu 300 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider -rA
step tests_finite_gpu 40 python3 -m pytest -q -m gpu tests/train/test_divergence.py -k all_finite -p no:cacheprovider
step scan_main 100 python3 kernels/bench_scan.py --skip-torch
echo "== end $(date +%T)"
