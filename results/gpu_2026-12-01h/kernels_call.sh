# GPU call of 2026-12-01 (eighth session): `bench_scan.py --dtypes` (or the table BENCH names) on main, then with each candidate patch of
# results/cpu_2026-12-01g, _h, _i or cpu_2026-12-02* (found by name) applied (a name "a+b" applies both; reverted after its run), then,
# while time is left, the kernel GPU tests with the patches of TEST (same "a+b" form) applied. Run from the
# repository root.
source scripts/device_setup.sh || exit 1
start=$SECONDS
limit=${LIMIT:-600}
patch_path() { ls results/cpu_2026-12-01[ghi]/*/"$1".patch results/cpu_2026-12-02*/*/"$1".patch 2>/dev/null | head -1; }  # a candidate by name
patches() { local p=(); IFS=+ read -ra names <<< "$1"; for n in "${names[@]}"; do p+=("$(patch_path "$n")"); done; echo "${p[@]}"; }
left() { echo $(( limit - (SECONDS - start) )); }
bench=${BENCH:---dtypes}  # the bench_scan.py table to take (--segments times the time-parallel split)
run() {  # run NAME: one $bench table into $OUT/<table>_NAME.md, unless too little of the call is left
  if (( $(left) < ${MARGIN:-110} )); then echo "== $1 skipped (time)"; return; fi
  local out="$OUT/${bench#--}_$1.md"
  echo "== $1 $(date +%T)"; timeout ${BENCH_TIMEOUT:-150} python3 kernels/bench_scan.py $bench > "$out" 2>&1; tail -3 "$out"
}
for c in ${CANDIDATES:-main}; do
  if [[ $c == main* ]]; then run "$c"; continue; fi
  p=$(patches "$c")
  git apply $p || { echo "== $c does not apply"; continue; }
  run "$c"
  git apply -R $p
done
if [[ -n $TEST ]] && (( $(left) > 200 )); then
  p=$(patches "$TEST"); git apply $p && echo "== tests with $TEST $(date +%T)" \
    && timeout $(( $(left) - 15 )) python3 -m pytest -q -m gpu tests/kernels/test_selective_scan.py tests/kernels/test_mobius_scan.py 2>&1 | tail -15 | tee "$OUT/tests_${TEST//+/_and_}.log"
  git apply -R $p
elif [[ -n $TEST ]]; then echo "== tests skipped (time)"; fi
echo "== end $(date +%T)"
