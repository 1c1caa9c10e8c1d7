# Written in the nineteenth session (2026-12-03) for the next GPU session; not run yet. One device call. First
# (KERNELS=1, about three minutes) the sliced KLA scan at real size against the float64 oracle (`pytest -m gpu -k
# large_state`), `bench_scan.py --states` (wide keys whole against in slices of 16) and
# results/cpu_2026-12-03c/ss_bm16_lengths.py, all into kernels.md (kernels/NOTES.md, "Measurements still to take",
# items 2 and 3); then, for the rest of the call's 600 s less MARGIN (45 s), results/gpu_2026-12-03c/call.sh at
# d_state $DSTATES (default 64: MQAR's capacity unit, now on the sliced scan), started or resumed from
# .carry/synthetic_state. Carry `.whl` and `.carry/synthetic_state`; run it again (without KERNELS), back to back, to
# resume. At most 8 files come back: kernels.md, block.log, three results files and two 15 MB state parts (the
# d_state-64 unit's state: about 18 MiB). Then, here: `run_synthetic.py merge --from <files_at>/synthetic --results
# results/synthetic --state .carry/synthetic_state` and `report`.
start=$(date +%s)
source scripts/device_setup.sh || exit 1
if [ "${KERNELS:-0}" = 1 ]; then
  { timeout 150 python3 -m pytest -q -m gpu tests/kernels -k large_state 2>&1 | tail -4
    timeout 150 python3 kernels/bench_scan.py --states
    timeout 150 python3 results/cpu_2026-12-03c/ss_bm16_lengths.py; } 2>&1 | tee $OUT/kernels.md
fi
KERNELS=0 DSTATES=${DSTATES:-64} MARGIN=$(( ${MARGIN:-45} + $(date +%s) - start )) bash results/gpu_2026-12-03c/call.sh
