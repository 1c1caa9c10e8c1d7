# Written in the fourteenth session, not run yet: one device call (carry `.whl`; about 5 minutes) that times
# ss_bwd_half_scratch.patch (the selective scan's backward keeping every other state in scratch) against main:
# ss_time.py on main, on the patch, on main, on the patch (interleaved: two runs of one tree give the noise), then
# the selective scan's GPU tests with the patch; the tree is left as it came. Returns ss_call.tgz.
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/ss
trap 'tar -czf $OUT/ss_call.tgz -C /tmp/ss .' EXIT
PATCH=results/cpu_2026-12-02e/ss_bwd_half_scratch.patch
apply() { git apply "$@" $PATCH 2>/dev/null || patch -p1 --forward "$@" < $PATCH; }
unapply() { git apply -R $PATCH 2>/dev/null || patch -p1 -R < $PATCH; }
timing() { echo "== $1 $(date +%T)"; timeout 150 python3 results/cpu_2026-12-02e/ss_time.py $1 > /tmp/ss/$1.md 2>&1
  tail -6 /tmp/ss/$1.md; tar -czf $OUT/ss_call.tgz -C /tmp/ss .; }
timing main_1
apply || exit 1
timing half_1
unapply || exit 1
timing main_2
apply || exit 1
timing half_2
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_selective_scan.py -p no:cacheprovider 2>&1 | tail -3 \
  | tee /tmp/ss/tests_gpu_half.log
unapply
echo "== end $(date +%T)"
