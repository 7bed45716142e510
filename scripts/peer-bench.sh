#!/usr/bin/env bash
# `whale serve` beside the engines users would pick instead, on the same checkpoint: vLLM's CPU
# build and llama.cpp's `llama-server` (an f32 GGUF of the checkpoint). Opt-in; CI never runs it.
#
#   scripts/peer-bench.sh                 # the base model, both peers, 64 concurrent and 1
#   scripts/peer-bench.sh vllm            # one peer
#   WHALE_PEER_MODEL=DIR scripts/peer-bench.sh    # another checkpoint directory
#   WHALE_PEER_MODEL=random scripts/peer-bench.sh # the random 5.25M-parameter model (`whale lm random`)
#   WHALE_PEER_MODEL=DIR WHALE_PEER_GGUF=FILE.gguf scripts/peer-bench.sh llama.cpp
#                                         # llama.cpp on that GGUF (a quantized one, say) instead
#
# For each peer and each concurrency it runs `whale serve bench --model DIR --peer URL
# --ignore-eos` (every reply max_tokens long on both sides, rounds alternating between whale
# serve and the peer) and keeps its table in $WORK/MODEL-PEER-N.txt. Each server runs on 127.0.0.1
# under `timeout` and is stopped before the next starts, so only one engine holds the cores at a
# time. Settings: WHALE_PEER_ROUNDS (10 at 64 concurrent, 3 times that at 1), WHALE_PEER_TOKENS
# (64), WHALE_PEER_PROMPT_WORDS (0: words of synthetic context before each question, for longer
# prompts; `whale serve bench --prompt-words`), WHALE_PEER_VLLM_KV_GB (1: vLLM's KV cache; SmolLM2
# at 64 concurrent needs about 2). Work files go to WHALE_PEER_DIR (default: a new directory
# under /tmp); the last lines are the summary.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WHALE_PEER_DIR:-$(mktemp -d /tmp/whale-peer-bench.XXXXXX)}
PEERS=${*:-vllm llama.cpp}
ROUNDS=${WHALE_PEER_ROUNDS:-10}
TOKENS=${WHALE_PEER_TOKENS:-64}
PROMPT_WORDS=${WHALE_PEER_PROMPT_WORDS:-0}
mkdir -p "$WORK"
PIDS=()
cleanup() { for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill -- -"$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

WHALE=${WHALE_BIN:-$ROOT/target/release/whale}
if [ -z "${WHALE_BIN:-}" ]; then
    (cd "$ROOT" && cargo build --release -q -p whale)
fi
MODEL=${WHALE_PEER_MODEL:-}
if [ -z "$MODEL" ]; then
    "$WHALE" lm pretrain >"$WORK/pretrain.log" 2>&1
    MODEL=$(sed -n 's/^base model already trained: //p; s/^model: //p' "$WORK/pretrain.log" | tail -1)
elif [ "$MODEL" = random ]; then
    MODEL=$WORK/random-model
    [ -f "$MODEL/config.json" ] || "$WHALE" lm random -o "$MODEL"
fi
[ -n "$MODEL" ] && [ -f "$MODEL/config.json" ] \
    || { echo "peer-bench: no checkpoint at '$MODEL' (pretrain log: $WORK/pretrain.log)" >&2; exit 1; }
MODEL=$(cd "$MODEL" && pwd)
NAME=$(basename "$MODEL")
GGUF=$WORK/$NAME-f32.gguf

# port_free PORT: exit when something already listens there, which wait_for would take for the
# server about to start.
port_free() {
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
        echo "peer-bench: port $1 is already in use; stop what listens there first" >&2
        exit 1
    fi
}

# wait_for NAME URL SECONDS: until the server just started (the last of PIDS) lists its models;
# exits at once if it does.
wait_for() {
    for _ in $(seq "$3"); do
        curl -sf "$2/models" >/dev/null 2>&1 && return 0
        if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
            tail -20 "$WORK/$1.log"
            echo "peer-bench: $1 exited (log: $WORK/$1.log)" >&2
            exit 1
        fi
        sleep 1
    done
    tail -20 "$WORK/$1.log"
    echo "peer-bench: $1 did not come up at $2 within $3 s (log: $WORK/$1.log)" >&2
    exit 1
}

start_vllm() {
    local py
    py=$("$ROOT/scripts/vllm-venv.sh" | tail -1)
    port_free 8321
    setsid env VLLM_CPU_KVCACHE_SPACE="${WHALE_PEER_VLLM_KV_GB:-1}" \
        timeout 3600 "$py" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL" --served-model-name peer --host 127.0.0.1 --port 8321 --dtype float32 --seed 0 \
        --no-enable-chunked-prefill --max-num-batched-tokens 32768 --max-model-len 2048 \
        --max-num-seqs 64 >"$WORK/vllm.log" 2>&1 &
    PIDS+=($!)
    wait_for vllm http://127.0.0.1:8321/v1 300
}

# llama.cpp's converter hashes the tokenizer's output to name its pre-tokenizer and knows none
# for whale's own byte-level BPE, whose split is GPT-2's: the wrapper declares it so when the
# converter does not recognise the tokenizer (it does SmolLM2's). The converter runs in
# WHALE_CONVERT_PYTHON (any Python with torch, transformers and sentencepiece), else in vLLM's
# venv.
to_gguf() {
    local src=$1
    local py=${WHALE_CONVERT_PYTHON:-}
    [ -n "$py" ] || py=$("$ROOT/scripts/vllm-venv.sh" | tail -1)
    [ -f "$GGUF" ] && return 0
    PYTHONPATH="$src:$src/gguf-py" "$py" - "$MODEL" "$GGUF.partial" >"$WORK/convert.log" 2>&1 <<'PY' || return 1
import runpy
import sys

import conversion.base

known = conversion.base.TextModel.get_vocab_base_pre


def pre_tokenizer(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"


conversion.base.TextModel.get_vocab_base_pre = pre_tokenizer
model, out = sys.argv[1:]
sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", "f32"]
runpy.run_module("convert_hf_to_gguf", run_name="__main__")
PY
    mv "$GGUF.partial" "$GGUF"
}

start_llama() {
    local server
    server=$("$ROOT/scripts/llama-cpp-venv.sh" | tail -1)
    if [ -n "${WHALE_PEER_GGUF:-}" ]; then
        GGUF=$WHALE_PEER_GGUF
    else
        to_gguf "${WHALE_LLAMA_VENV:-$HOME/.cache/whale-venvs/llama-cpp}/src" \
            || { tail -5 "$WORK/convert.log"; echo "peer-bench: GGUF conversion failed ($WORK/convert.log)" >&2; exit 1; }
    fi
    # 64 slots of 2,048 positions each, continuous batching, one thread per core.
    port_free 8322
    setsid timeout 3600 "$server" -m "$GGUF" --alias peer --host 127.0.0.1 --port 8322 \
        --parallel 64 --ctx-size $((64 * 2048)) --threads "$(nproc)" --seed 0 >"$WORK/llama.cpp.log" 2>&1 &
    PIDS+=($!)
    wait_for llama.cpp http://127.0.0.1:8322/v1 120
}

stop_last() { kill -- -"${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'; sleep 2; }

SUMMARY=()
for peer in $PEERS; do
    case $peer in
        vllm) start_vllm; url=http://127.0.0.1:8321/v1 ;;
        llama.cpp) start_llama; url=http://127.0.0.1:8322/v1 ;;
        *) echo "peer-bench: unknown peer $peer (vllm, llama.cpp)" >&2; exit 2 ;;
    esac
    for requests in 64 1; do
        rounds=$ROUNDS
        [ "$requests" = 1 ] && rounds=$((ROUNDS * 3))
        "$WHALE" serve bench --model "$MODEL" --peer "$url" --peer-model peer --ignore-eos \
            --requests "$requests" --rounds "$rounds" --max-tokens "$TOKENS" --prompt-words "$PROMPT_WORDS" \
            | tee "$WORK/$NAME-$peer-$requests.txt"
        SUMMARY+=("$peer, $requests concurrent: $(grep 'whale serve / peer' "$WORK/$NAME-$peer-$requests.txt")")
    done
    stop_last
done
printf 'peer-bench on %s (tables in %s):\n' "$MODEL" "$WORK"
printf '  %s\n' "${SUMMARY[@]}"
