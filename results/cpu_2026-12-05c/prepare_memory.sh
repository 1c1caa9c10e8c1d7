#!/usr/bin/env bash
# Peak memory and time of `klalm-prepare-data` on enwiki_local's train split (shards 0-8 of enwiki_2015, about 19.8M
# GPT-2 tokens), before (eca4c05: the whole split read into a list first) and after (records tokenised as read),
# alternately, twice each, in one checkout with the old source on PYTHONPATH from a git worktree. Run from the repo
# root:  bash results/cpu_2026-12-05c/prepare_memory.sh > results/cpu_2026-12-05c/prepare_memory.txt
set -euo pipefail
BEFORE=${BEFORE:-eca4c05}
tree=$(mktemp -d)/before
git worktree add -q --detach "$tree" "$BEFORE"
trap 'git worktree remove --force "$tree"' EXIT
echo "# $(date -u +%F) $(nproc) cores; before = $BEFORE, after = $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+changes')"
echo "# klalm-prepare-data's table row: | split | documents | tokens | shards | dtype | skipped | seconds | tokens/s |"
for round in 1 2; do
  for version in before after; do
    src=$PWD/src; [ "$version" = before ] && src=$tree/src
    out=$(mktemp -d)
    PYTHONPATH=$src /usr/bin/time -f "$version round $round: max RSS %M kB, wall %e s, user %U s" \
      .venv/bin/python -c "import sys, klalm.data.prepare as p; assert p.__file__.startswith('$src'); \
p.main(['--data', 'enwiki_local', '--splits', 'train', '--out', '$out/shards', '--no-progress'])" 2>&1 \
      | grep -E '^\| train|round'
    rm -rf "$out"
  done
done
