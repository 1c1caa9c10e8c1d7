# Written in the fourteenth session, not run yet: one device call (carry `.whl`; at most about 9 minutes, every step under
# its own `timeout`), for numbers the docs quote but no committed file holds, or that predate the kernels on main:
# 1. the scan kernels at README's headline size (B8 L2048 M1536 S16) and the length sweep L 512-16384
#    (`bench_scan.py --skip-torch`; README's 0.61 / 2.97 ms predate the half-scratch backward);
# 2. #17's per-token length target, forward+backward per token from L 512 to 65,536 at 16,384 tokens a call
#    (`bench_scan.py --lengths --skip-torch`; 1.42x against <= 1.3x when last measured, before the half-scratch backward);
# 3. all ten presets without compile (`bench_lm.py`'s defaults: B16 x T2048, 15 steps, the last 5 timed), the shape of
#    docs/benchmarks.md's first table, whose 2026-11-29 output was not committed, and of the study's cost table
#    (docs/RESULTS.md: gdn "not measured" until this file joins `cost.bench_rows` in configs/study/enwiki_45m.yaml).
# 4. (run first, seconds) why the step's parameter finiteness check ran as 105 per-tensor reductions (finite_check.py).
# Everything comes back in next_call.tgz, rewritten after each step and when the script exits.
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/nc
trap 'tar -czf $OUT/next_call.tgz -C /tmp/nc .' EXIT
step() { local name=$1 limit=$2; shift 2; echo "== $name $(date +%T)"
  timeout "$limit" "$@" > /tmp/nc/$name.log 2>&1; echo "rc $? $(date +%T)" >> /tmp/nc/$name.log
  tail -25 /tmp/nc/$name.log; tar -czf $OUT/next_call.tgz -C /tmp/nc .; }
step finite_check 60 python3 results/cpu_2026-12-02e/finite_check.py
step scan_main 170 python3 kernels/bench_scan.py --skip-torch
step scan_lengths 140 python3 kernels/bench_scan.py --lengths --skip-torch
# foreach AdamW, as the study's runs and the 2026-11-29 table (fused is the default since the fourteenth session)
step bench_all_eager 180 python3 scripts/bench_lm.py --override optim.fused=false --out /tmp/nc/bench_all_eager.md
echo "== end $(date +%T)"
