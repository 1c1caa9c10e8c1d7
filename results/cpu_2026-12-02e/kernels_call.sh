# Written in the fourteenth session, not run yet: one device call (carry `.whl`; about 9 minutes, every step under its
# own `timeout`) that times this folder's two kernel candidates against main with scan_time.py: main, both patches,
# main, both patches (interleaved: the two runs of one tree give the noise). ss_bwd_half_scratch.patch changes only
# the selective scan's backward (its rows in the table), kla_bwd_rows_once.patch, applied on top of it, only the KLA
# backward (the KLA rows). Then the kernel GPU tests with both applied; the tree is left as it came. Returns
# kernels_call.tgz (rewritten after every step).
source scripts/device_setup.sh || exit 1
mkdir -p /tmp/kc
trap 'tar -czf $OUT/kernels_call.tgz -C /tmp/kc .' EXIT
D=results/cpu_2026-12-02e
PATCHES="$D/ss_bwd_half_scratch.patch $D/kla_bwd_rows_once.patch"
apply() { for p in $PATCHES; do git apply $p 2>/dev/null || patch -p1 --forward -s < $p || return 1; done; }
unapply() { for p in $(echo $PATCHES | tr ' ' '\n' | tac); do git apply -R $p 2>/dev/null || patch -p1 -R -s < $p; done; }
timing() { echo "== $1 $(date +%T)"; timeout 100 python3 $D/scan_time.py $1 > /tmp/kc/$1.md 2>&1
  echo "rc $? $(date +%T)" >> /tmp/kc/$1.md; tail -8 /tmp/kc/$1.md; tar -czf $OUT/kernels_call.tgz -C /tmp/kc .; }
timing main_1
apply || exit 1
timing both_1
unapply
timing main_2
apply || exit 1
timing both_2
timeout 120 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider 2>&1 | tail -3 | tee /tmp/kc/tests_gpu_both.log
unapply
echo "== end $(date +%T)"
