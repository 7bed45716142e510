#!/usr/bin/env bash
# Peak memory and time of `whale serve` answering one long chat prompt (docs/benchmarks.md,
# "Long prompts: chunked prefill"). The prompt is the README's words repeated to WORDS words
# (1,800 give 3,731 tokens on Qwen2.5-Coder), sent once with curl, greedy, 4 tokens.
#
#   bench/long_prompt_memory.sh [WHALE_BINARY] [MODEL] [WORDS]
set -euo pipefail
whale=${1:-target/release/whale}
model=${2:-qwen2.5-coder-1.5b}
words=${3:-1800}
out=$(mktemp -d)
python3 - "$words" "$model" > "$out/request.json" <<'PY'
import json, sys
words = open("README.md").read().split()
text = " ".join((words * 50)[: int(sys.argv[1])])
print(json.dumps({"model": sys.argv[2], "messages": [{"role": "user", "content": "Summarise in one line:\n" + text}],
                  "max_tokens": 4, "temperature": 0}))
PY
/usr/bin/time -v "$whale" serve --model "$model" --port 0 > "$out/serve.out" 2> "$out/serve.err" &
for _ in $(seq 1 300); do grep -q "listening on" "$out/serve.out" 2>/dev/null && break; sleep 1; done
url=$(sed -n 's/^listening on //p' "$out/serve.out")
start=$(date +%s.%N)
curl -s "$url/chat/completions" -H 'Content-Type: application/json' -d @"$out/request.json" > "$out/reply.json" || true
end=$(date +%s.%N)
pkill -TERM -f "^$whale serve --model $model --port 0" || true
wait || true
echo "request seconds: $(python3 -c "print(round($end - $start, 1))")"
grep -E "Maximum resident set size|terminated by signal" "$out/serve.err" || true
python3 -c "import json; r = json.load(open('$out/reply.json')); print(r.get('usage') or r)" 2>/dev/null || echo "no reply"
