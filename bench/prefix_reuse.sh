#!/bin/bash
# Each harness given run twice on SmolLM2-135M-Instruct, over synthetic one-hop QA drawn as
# examples/qa-smollm2.toml draws it: with every prompt fed whole (--prefix-cache-tokens 0), then
# with 16,384 tokens of finished calls kept for the prompts that begin with them. Prints each
# run's summary, wall time and peak RSS.
#
#   bench/prefix_reuse.sh qa/passages qa/fewshot        # LIMIT=16 tasks by default
#   LIMIT=8 WHALE=target/release/whale bench/prefix_reuse.sh path/to/harness.js
set -euo pipefail
whale=${WHALE:-target/release/whale}
for harness in "$@"; do
  for tokens in 0 16384; do
    echo "== $harness, prefix_cache_tokens = $tokens"
    /usr/bin/time -f "wall %e s, peak RSS %M KB" "$whale" harness run "$harness" --domain qa --gen 320 \
      --limit "${LIMIT:-16}" --k 4 --seed 0 --temperature 0.3 --max-tokens 64 --model smollm2 \
      --prefix-cache-tokens "$tokens" 2>&1 | grep -v '^\['
  done
done
