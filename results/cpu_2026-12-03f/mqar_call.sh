# Written in the twenty-second session (2026-12-03). One device call of MQAR units (carry `.whl` and
# `.carry/synthetic_state`), within LIMIT (600 s) less MARGIN (45 s): the ready or paused units of ARCHS at CELLS,
# DEPTHS, DMODELS, DSTATES (KLA's key width) and LRS (empty: the plan's four rates), resumed from
# .carry/synthetic_state and paused at the budget's end. The defaults are the capacity stage's last unit: the long
# cell (2048, 256), one plain KLA block, d_model 128, d_state 128, lr 2.2e-3. Others:
#   Zoology's grid:              ARCHS=kla,gpt CELLS=64x4 DEPTHS=2 DMODELS=256 DSTATES=16 LRS= bash ...
#   two blocks at the long cell: DEPTHS=2 DSTATES=16 bash ...
# STAGES (twenty-third session) runs several depth:d_state pairs one after another in the same call, each with the
# budget the ones before it left (a unit that ends early hands its time on):
#   finish d_state 128, then two blocks: STAGES="1:128 2:16" bash ...
# IN_PROCESS=1 (twenty-third session; the default since the twenty-fourth, `IN_PROCESS=` turns it off) passes
# --in-process: the unit trains in the runner's process, on its main thread, skipping the child process's start,
# imports and exit (22–25 s of each call's overhead in results/gpu_2026-12-03g; 1.7–2.4 s in-process in
# results/gpu_2026-12-03h, its first GPU run); if that run exits non-zero, the stage runs again in a child process.
# (The full plan runs one unit at a time on each GPU, so on one GPU in-process loses no parallel slot.)
# FROM=DIR (twenty-fifth session; scripts/device_synthetic.sh, which replaced the twenty-fourth session's CONTINUE=1):
# the next call right after one, carrying `.whl` and DIR, a copy of what the last call returned.
# Since the twenty-third session's calls this script only builds the stages' options: scripts/device_synthetic.sh
# (RUNS) runs them, with the budget, checkpoints, watcher and final pack this script had.
# Unlike the earlier scripts (results/cpu_2026-12-03e/dstate128_call.sh, grid_call.sh), a running unit saves a
# checkpoint every CHECKPOINT_S (120 s) and `pack --every-s 20` ships each one into $OUT, so a call the device stops
# early (it gives less than timeout_s when less device time is left, and a cold start takes one to four minutes of
# it) brings back the last checkpoint instead of nothing. Afterwards, here: `merge --from <files_at>/synthetic
# --results results/synthetic --state .carry/synthetic_state` (which also records the progress of a stopped call's
# checkpoint). With TEST=1 (once, on the session's first call), first
# the GPU tests of MQAR's step and evaluation (`pytest -m gpu tests/tasks/test_graph.py -k mqar`, into test.log; into block.log since the thirty-fifth session).
LRS=${LRS-2.2e-3}; : ${ARCHS:=kla} ${CELLS:=2048x256} ${DEPTHS:=1} ${DMODELS:=128} ${DSTATES:=128}
RUNS=$(for stage in ${STAGES:-$DEPTHS:$DSTATES}; do
  echo "--families mqar --archs $ARCHS --mqar-cells $CELLS --mqar-depths ${stage%%:*} --mqar-d-models $DMODELS" \
    "--mqar-d-states ${stage#*:}${LRS:+ --lrs $LRS}"
done)
[ "${TEST:-0}" = 1 ] && TESTS="tests/tasks/test_graph.py -k mqar"
RUNS=$RUNS TESTS=${TESTS:-} IN_PROCESS=${IN_PROCESS-1} exec bash scripts/device_synthetic.sh
