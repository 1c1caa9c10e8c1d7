# GPU call of 2026-12-01 (seventh session): `bench_scan.py --dtypes` on main, then with each untimed candidate
# patch of results/cpu_2026-12-01f applied alone (reverted after its run). Run from the repository root.
source scripts/device_setup.sh || exit 1
start=$SECONDS
run() {  # run NAME: one --dtypes table into $OUT/dtypes_NAME.md, unless too little of the call's 600 s is left
  if (( SECONDS - start > 600 - ${MARGIN:-90} )); then echo "== $1 skipped (time)"; return; fi
  echo "== $1 $(date +%T)"; timeout 100 python3 kernels/bench_scan.py --dtypes > $OUT/dtypes_$1.md 2>&1; tail -3 $OUT/dtypes_$1.md
}
run main
for c in ${CANDIDATES:-fwd_row_bases_joint_store fwd_row_bases_rcp_fold bwd_int32_offsets bwd_int32_offsets_reuse_state ss_row_bases_direct_stores}; do
  git apply results/cpu_2026-12-01f/$c.patch || { echo "== $c does not apply"; continue; }
  run $c
  git apply -R results/cpu_2026-12-01f/$c.patch
done
run main_b
echo "== end $(date +%T)"
