#!/usr/bin/env bash
# Text samples from `make train`'s model (klalm-train experiment=offline: KLA tiny, 512 steps on the python_docs
# corpus), for docs/eval.md "Generating text". Trains the model into $RUN first unless it is there already. Run from
# the repo root:  bash results/cpu_2026-12-05c/generate_offline.sh > results/cpu_2026-12-05c/generate_offline.txt
set -euo pipefail
RUN=${RUN:-outputs/generate_offline}   # inside the repository's ignored outputs/
# (run with paths.run_dir="$RUN" on 2026-12-05; klalm-train refuses that since, as it split the run over two folders)
[ -f "$RUN/summary.json" ] || .venv/bin/klalm-train experiment=offline hydra.run.dir="$RUN" > /dev/null 2>&1
echo "# $(date -u +%F), $(nproc) cores, klalm $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo "+changes"); the run's summary.json:"
python3 -c "import json,sys; s=json.load(open('$RUN/summary.json')); print({k: s[k] for k in ('params','steps','tokens_seen','val_loss','val_ppl','wall_s')})"
echo
cmd=(.venv/bin/klalm-generate "$RUN" --prompt "The for statement" --max-new-tokens 40 --num-samples 2)
echo "\$ klalm-generate $RUN --prompt \"The for statement\" --max-new-tokens 40 --num-samples 2   (stdout and stderr;"
echo "  transformers' weight-loading progress bar and its sharding warning left out)"
"${cmd[@]}" 2>&1 | grep -v -E 'Loading weights|not sharded' | sed "s#$PWD/##g" || true   # paths relative to the repository
