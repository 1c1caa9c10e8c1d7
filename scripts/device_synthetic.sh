#!/usr/bin/env bash
# One call of the device tool that runs synthetic units (carry `.whl` and `.carry/synthetic_state`; docs/synthetic.md,
# "For the GPU session"). RUNS holds one stage per line: the options of `run_synthetic.py run` that pick its units
# (`--families`, `--archs`, `--a5-lengths`, `--mqar-cells`, `--seeds`, `--lrs`, ...). The stages run in order, each
# with the seconds the ones before it left of LIMIT (600) less MARGIN (45), so a stage that ends early hands its
# time on; one with under 150 s left is skipped. Every stage resumes its paused units from .carry/synthetic_state,
# pauses at the budget's end, and saves a checkpoint every CHECKPOINT_S (120) s, which `pack --every-s 20` ships
# into $OUT as it comes: a call the device stops early (it gives less than timeout_s when less device time is left,
# and a cold start comes out of it) still brings back the last checkpoint. Results go to $OUT/synthetic (copies of
# results/synthetic's files of the families the stages name, with progress.jsonl and rates.jsonl).
#   RUNS='--families a5 --archs kla --a5-lengths 12 --a5-depths 1 --seeds 3,4' bash scripts/device_synthetic.sh
#   RUNS=$'--families mqar --archs kla --mqar-cells 2048x256 --mqar-depths 2 --mqar-d-states 16 --lrs 2.2e-3\n--families a5 --archs gpt --a5-lengths 16,20 --a5-depths 3 --seeds 3,4' bash ...
# Other knobs: TESTS (pytest arguments, split at spaces: GPU tests run first, into block.log, at most 150 s),
# IN_PROCESS=1 (`--in-process`: units train in the runner's process, skipping a child process's start and exit; a
# stage that then exits non-zero runs again in a child process), FINISH_ONLY=1 (`--finish-only`, a session's last
# call). It exits 1 if a stage failed (its error is in block.log), after running the others.
# Afterwards, here: `run_synthetic.py merge --from <files_at>/synthetic --results results/synthetic --state
# .carry/synthetic_state`.
# FROM=DIR (twenty-fifth session): start from what the last call returned, carried with this one (carry `.whl` and
# DIR): DIR holds that call's files as they came back (`synthetic/`, `state.tar.*`), copied here into an ignored
# folder. The call merges DIR's rows into $OUT/synthetic and replaces .carry/synthetic_state by DIR's state parts
# (`merge --state`), so it can be sent the moment the last call returns, on a warm machine or a fresh one, and the
# last call's merge here can wait until this one runs. A DIR without state parts (a call stopped before it packed)
# stops it at once with exit 3: merge that call here and send this one from the state folder here, packed (below).
# State parts pack the states' bytes in planes, deflated (thirty-sixth session): a d_model-256 MQAR unit's 58.6 MiB
# state packs to 49.4 MiB, which a call carries beside the 9.9 MB tree (64 MiB in all; the unpacked folder does not
# fit). So a state folder at home goes as parts too: `run_synthetic.py pack --state .carry/synthetic_state --out
# .carry/state_in`, then FROM=.carry/state_in, carrying `.whl` and .carry/state_in.
# Parts too large even so: copy the last call's files without them (`mkdir -p .carry/last_call && cp -r
# <files_at>/synthetic <files_at>/block.log .carry/last_call/ && chmod -R u+w .carry/last_call`) and send FROM it
# within the 30 s the warm machine waits: the sha256 of the parts the last call packed (its block.log's "== state
# sha256" line) must match the one that call left beside the state folder when it ended (a call removes it when it
# starts, so one cut off leaves none), or it stops with exit 3 (a fresh machine). Merge those parts here later.
start=$(date +%s)
left() { echo $(( ${LIMIT:-600} - ($(date +%s) - start) - ${MARGIN:-45} )); }
if [ -z "${RUNS:-}" ]; then echo "device_synthetic.sh: set RUNS (one line of run options per stage)" >&2; exit 2; fi
if [ -n "${FROM:-}" ]; then
  restore=(--state .carry/synthetic_state)  # replace this machine's state by the parts FROM brings
  if [ ! -d "$FROM/synthetic" ] && ! compgen -G "$FROM/state.tar.*" > /dev/null; then
    echo "device_synthetic.sh: FROM=$FROM has no synthetic/ folder and no state.tar.* parts (carry the folder a" \
      "call's files came back in, or one \`run_synthetic.py pack\` filled)" >&2
    exit 2
  fi
  if ! compgen -G "$FROM/state.tar.*" > /dev/null; then  # parts left home: this machine must still hold them
    sent=$(grep -o '^== state sha256 [0-9a-f]*' "$FROM/block.log" 2>/dev/null | tail -1 | cut -d' ' -f4)
    if [ -z "$sent" ] || [ "$sent" != "$(cat .carry/synthetic_state.sha256 2>/dev/null)" ]; then
      echo "device_synthetic.sh: FROM=$FROM has no state.tar.* parts and this machine does not hold the state" \
        "that call left (a fresh machine, or a call stopped before it packed): merge it at home and send this" \
        "call FROM the state folder there, packed (\`run_synthetic.py pack\`)" >&2
      exit 3
    fi
    restore=()
  fi
fi
rm -f .carry/synthetic_state.sha256  # from here the state folder changes: a call cut off before its end leaves none
source scripts/device_setup.sh || exit 1
# the results files of the families the stages name (all, where a stage names none), with progress and rates: at
# most 8 files come back from a call, so a5.jsonl stays home when only MQAR runs
families=$(grep -o -- '--families [a-z0-9_,]*' <<< "$RUNS" | cut -d' ' -f2 | tr ',' ' ')
grep -qv -- '--families' <<< "$(grep -v '^$' <<< "$RUNS")" && families="a5 mqar mad"
mkdir -p "$OUT/synthetic" .carry/synthetic_state
for name in progress rates $families; do
  [ ! -f "results/synthetic/$name.jsonl" ] || cp "results/synthetic/$name.jsonl" "$OUT/synthetic/"
done
if [ -n "${FROM:-}" ]; then  # the last call's rows and states: what this call starts from, recorded in block.log
  merged=$(python3 scripts/run_synthetic.py merge --from "$FROM/synthetic" --results "$OUT/synthetic" \
    "${restore[@]}") || exit 1
  [ ${#restore[@]} -gt 0 ] || merged="$merged; the state this machine kept"
  echo "== from $FROM: $merged" | tee -a "$OUT/block.log"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  timeout 150 python3 -m pytest -q -m gpu $TESTS 2>&1 | tail -4 | sed 's/^/== test: /' | tee -a "$OUT/block.log"
fi
python3 scripts/run_synthetic.py pack --state .carry/synthetic_state --out "$OUT" --every-s 20 & watcher=$!
status=0  # 1 once a stage has failed (a bad option, a unit that failed): the later stages still run
while IFS= read -r stage <&3; do
  [ -n "$stage" ] || continue
  if [ "$(left)" -lt 150 ]; then echo "== skipped, $(left) s left: $stage" | tee -a "$OUT/block.log"; continue; fi
  for attempt in 1 2; do  # an in-process stage that fails runs again once in a child process
    echo "== $stage; budget $(left) s${IN_PROCESS:+, in-process}" | tee -a "$OUT/block.log"
    # shellcheck disable=SC2086  # a stage is a list of options
    python3 scripts/run_synthetic.py run --plan full $stage --results "$OUT/synthetic" --state .carry/synthetic_state \
      --time-budget-s "$(left)" --checkpoint-every-s "${CHECKPOINT_S:-120}" ${IN_PROCESS:+--in-process} \
      ${FINISH_ONLY:+--finish-only} 2>&1 | tee -a "$OUT/block.log" | tail -25
    code=${PIPESTATUS[0]}
    [ "$code" != 0 ] && [ -n "${IN_PROCESS:-}" ] && [ "$(left)" -ge 150 ] || break
    echo "== the in-process run exited with $code: the stage again in a child process" | tee -a "$OUT/block.log"
    IN_PROCESS=
  done
  [ "$code" = 0 ] || status=1
done 3<<< "$RUNS"
kill $watcher; wait $watcher 2>/dev/null; rm -f "$OUT"/.state.tar.*.tmp-*  # a piece left half written (klalm.fileio)
# what the parts hold, for a next call sent within the 30 s this warm machine waits, FROM a copy of these files
# without the parts: it finds the state still here and checks it against this line
if python3 scripts/run_synthetic.py pack --state .carry/synthetic_state --out "$OUT"; then
  cat "$OUT"/state.tar.[0-9][0-9] 2>/dev/null | sha256sum | cut -d' ' -f1 > .carry/synthetic_state.sha256
  echo "== state sha256 $(cat .carry/synthetic_state.sha256)" | tee -a "$OUT/block.log"
fi
ls -la .carry/synthetic_state "$OUT"; echo "== end $(( $(date +%s) - start )) s"
# a device call returns at most 8 files: with a large state (four 15 MiB parts) a log the caller writes into $OUT
# can push a results file out (results/gpu_2026-12-05: rates.jsonl)
returned=$(find "$OUT" -type f | wc -l)
[ "$returned" -le 8 ] || echo "== warning: $returned files under \$OUT, a call returns 8: some will not come back" |
  tee -a "$OUT/block.log"
exit $status
