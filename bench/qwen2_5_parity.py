#!/usr/bin/env python3
"""whale beside Hugging Face transformers on Qwen2.5-Coder-Instruct (Qwen2ForCausalLM: q/k/v
biases, no q/k norm, untied output), from Qwen's official Q4_K_M GGUF.

One entry point over the SmolLM2 scripts' checks, run on the directory `whale lm convert` makes
of the GGUF (converted first when --model holds none). Each check prints one row; exits 1 when one
fails, 2 when something it needs is missing.
  (e) conversion, in this process with bench/smollm2_convert_check.py's functions: every tensor of
      the converted directory equals what transformers gets loading the GGUF itself (names,
      shapes, values within --tolerance, default 0), the q/k/v biases, the config (head_dim as
      transformers' Qwen2 takes it when unset, the pad token from generation_config.json, and
      Qwen2's sliding-window keys), the logits of one chat (both loaded by transformers, within 1e-4), the chat template
      rendered by both, token ids of a few texts, the 96 chat prompts of (a) from both tokenizers,
      and NFC: Qwen's tokenizer.json (and whale's) normalizes to NFC, transformers' GGUF tokenizer
      does not, so a decomposed text is checked against the GGUF tokenizer on its NFC form;
  (a)+(b) bench/smollm2_greedy.py: the prompt ids whale renders for 32 chat prompts per domain
      (math, QA, chess) equal transformers' `apply_chat_template`, and whale's greedy tokens equal
      transformers' f32 `generate` on at least --min-greedy of them (default: all but one);
      llama.cpp only with --llama-server;
  (c)+(d) bench/hf_compare.py --checks-only: the ids of 64 GSM8K prompts, and the logits of a chat
      of two GSM8K turns in float64 (within 1e-9) and f32 (within hf_compare's bar: 1e-4, or twice
      transformers' own eager/sdpa spread when float64 agrees), plain and through a LoRA adapter
      `whale lm train` makes and peft loads.

Usage: WHALE_HF_VENV=~/.cache/whale-venvs/gguf python3 bench/qwen2_5_parity.py [--model DIR]
           [--gguf FILE] [--max-tokens 64] [--prompts 32] [--min-greedy N] [--torch-threads 2]
           [--llama-server BIN] [--skip e,ab,cd]
Defaults: $WHALE_HOME/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf and the directory beside it
(`whale lm fetch` puts them there). For the 1.5B model pass both paths (`whale lm convert
qwen2.5-coder-1.5b -o DIR` converts it). The virtual environment needs torch, transformers (5.x),
safetensors, peft and gguf.
"""

import argparse
import copy
import gc
import os
import re
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from hf_compare import FLOAT64_TOLERANCE, REPO, ensure_venv, template_ids  # noqa: E402
from smollm2_convert_check import CHAT, TEXTS, Checks, compare_config, compare_logits, compare_tensors  # noqa: E402
from smollm2_convert_check import whale_home  # noqa: E402
from smollm2_greedy import chess_prompts, math_prompts, qa_prompts  # noqa: E402

NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m"
# Qwen2's pre-tokenizer splits every digit alone and keeps a lone space before one as its own piece.
QWEN_TEXTS = [
    "x   1", "   3 spaces then 7", "pi = 3.14159265; n=1000000", "tab\tsep\r\nwindows\n\n\nthree",
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>",
    "fn main() { println!(\"{}\", 0x1F_u8); } // 中文注释 émoji 🐳🐳",
    "I'm sure you'll see: it's DONE'S and 'quoted'",
]
DECOMPOSED = "cafe\u0301 n\u0303o A\u030a"  # NFC composes each pair into one character


class Rows(Checks):
    """The rows of every check, with their time, for the summary at the end."""

    def __init__(self):
        super().__init__()
        self.summary, self.prefix = [], ""

    def row(self, name, ok, detail):
        name = self.prefix + name
        super().row(name, ok, detail)
        self.summary.append((name, ok, detail))


def conversion(rows, args):
    """(e): the converted directory beside transformers' own GGUF loader."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_dir, gguf_name = str(args.gguf.parent), args.gguf.name
    print(f"loading {args.gguf} with transformers ...", flush=True)
    reference = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()
    converted = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    weights = load_file(str(args.model / "model.safetensors"))
    compare_tensors(rows, reference.state_dict(), weights, converted.config.tie_word_embeddings, args.tolerance)
    biases = [n for n in weights if n.endswith("_proj.bias")]
    rows.row("q/k/v biases", len(biases) == 3 * converted.config.num_hidden_layers and
             not any(n.endswith(("o_proj.bias", "q_norm.weight", "k_norm.weight")) for n in weights),
             f"{len(biases)} projection biases (q, k, v of {converted.config.num_hidden_layers} layers), no q/k norm")
    del weights
    # transformers' GGUF config leaves head_dim unset (its Qwen2 then uses hidden / heads), and takes
    # pad_token_id from the GGUF, which the converted directory keeps in generation_config.json
    # and tokenizer_config.json (`pad_token`) as Qwen's own checkpoint does, not in config.json.
    effective = copy.deepcopy(reference.config)
    if getattr(effective, "head_dim", None) is None:
        effective.head_dim = effective.hidden_size // effective.num_attention_heads
    pad = GenerationConfig.from_pretrained(args.model).pad_token_id
    rows.row("pad token", pad == reference.config.pad_token_id,
             f"GGUF {reference.config.pad_token_id}; converted: config.json {converted.config.pad_token_id}, "
             f"generation_config.json {pad}, tokenizer {AutoTokenizer.from_pretrained(args.model).pad_token_id}")
    effective.pad_token_id = converted.config.pad_token_id
    compare_config(rows, effective, converted.config)
    keys = ["model_type", "hidden_act", "use_sliding_window", "sliding_window", "max_window_layers"]
    differing = [(k, getattr(reference.config, k, None), getattr(converted.config, k, None)) for k in keys
                 if getattr(reference.config, k, None) != getattr(converted.config, k, None)]
    # transformers' GGUF config leaves sliding_window at its default while use_sliding_window is off
    differing = [d for d in differing if not (d[0] in ("sliding_window", "max_window_layers")
                                              and not converted.config.use_sliding_window)]
    rows.row("config (Qwen2 keys)", not differing,
             f"differs: {differing}" if differing else ", ".join(f"{k} {getattr(converted.config, k, None)}"
                                                                for k in keys))
    theirs = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    ours = AutoTokenizer.from_pretrained(args.model)
    rendered = [t.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) for t in (theirs, ours)]
    rows.row("chat template", rendered[0] == rendered[1], f"{len(rendered[1])} characters rendered, "
             f"starts {rendered[1][:40]!r}")
    texts = TEXTS + QWEN_TEXTS + [rendered[1]]
    differing = [text for text in texts if theirs.encode(text, add_special_tokens=False)
                 != ours.encode(text, add_special_tokens=False)]
    rows.row("token ids (texts)", not differing, f"{len(texts)} texts; differing: {differing}")
    for text in differing:
        print(f"     {text!r}: GGUF {theirs.encode(text, add_special_tokens=False)} "
              f"converted {ours.encode(text, add_special_tokens=False)}")
    nfc = unicodedata.normalize("NFC", DECOMPOSED)
    ours_ids, nfc_ids = ours.encode(DECOMPOSED, add_special_tokens=False), theirs.encode(nfc, add_special_tokens=False)
    raw_ids = theirs.encode(DECOMPOSED, add_special_tokens=False)
    rows.row("NFC", ours_ids == nfc_ids, f"{DECOMPOSED!r}: converted {ours_ids} = GGUF tokenizer on its NFC form "
             f"{nfc_ids}; GGUF tokenizer on it as given {raw_ids} (no NFC normalizer: printed, not failed)")
    conversations = [[{"role": "user", "content": text}]
                     for build in (math_prompts, qa_prompts, chess_prompts) for text in build(args.prompts)]
    same = sum(template_ids(theirs, c) == template_ids(ours, c) for c in conversations)
    rows.row("96 prompts, both tokenizers" if args.prompts == 32 else "prompts, both tokenizers",
             same == len(conversations), f"{same}/{len(conversations)} chat prompts give the same ids from the "
             "converted tokenizer and transformers' GGUF tokenizer (each with its own template)")
    compare_logits(rows, reference, converted, template_ids(ours, CHAT))
    del reference, converted
    gc.collect()


def run(script, script_args, env):
    """Runs a bench script in this venv, its output shown indented as it comes and returned."""
    command = [sys.executable, str(BENCH / script), *script_args]
    print("running", " ".join(command[1:]), flush=True)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    lines = []
    for line in process.stdout:
        print("   >", line, end="", flush=True)
        lines.append(line)
    return process.wait(), "".join(lines)


def greedy(rows, args, env):
    """(a) and (b): bench/smollm2_greedy.py on the converted directory."""
    script_args = ["--model", str(args.model), "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
                   "--torch-threads", str(args.torch_threads)]
    if args.llama_server:
        script_args += ["--llama-server", args.llama_server, "--gguf", str(args.gguf)]
    else:
        env = dict(env, WHALE_LLAMA_VENV=str(BENCH / "no-llama-cpp-venv"))  # no llama.cpp unless asked
    code, output = run("smollm2_greedy.py", script_args, env)
    table = re.findall(r"^\| (math|qa|chess) \| (\d+)/(\d+) \| (\d+)/(\d+) \|$", output, re.M)
    if len(table) != 3 or code not in (0, 1):
        rows.row("(a)+(b) smollm2_greedy.py", False, f"exit {code}; no table (see its output above)")
        return
    ids, total = sum(int(t[1]) for t in table), sum(int(t[2]) for t in table)
    same, count = sum(int(t[3]) for t in table), sum(int(t[4]) for t in table)
    detail = ", ".join(f"{t[0]} {t[1]}/{t[2]}" for t in table)
    rows.row("(a) prompt ids = transformers'", ids == total, f"{ids}/{total} ({detail})")
    minimum = count - 1 if args.min_greedy is None else args.min_greedy
    detail = ", ".join(f"{t[0]} {t[3]}/{t[4]}" for t in table)
    timing = "; ".join(re.findall(r"(whale took \d+ s|transformers \S+ took \d+ s)", output))
    rows.row("(b) greedy tokens = transformers'", same >= minimum,
             f"{same}/{count} (at least {minimum}; {args.max_tokens} tokens each; {detail}; {timing})")
    for line in re.findall(r"^  prompt \d+: first differs.*$", output, re.M):
        print("     ", line.strip())
    for line in re.findall(r"^\| (?:quantized|f32) GGUF.*$", output, re.M):
        rows.row("llama.cpp", "| yes |" not in line or code == 0, line)


def logits(rows, args, env):
    """(c) and (d): bench/hf_compare.py --checks-only on the converted directory."""
    code, output = run("hf_compare.py", ["--model", str(args.model), "--checks-only",
                                         "--torch-threads", str(args.torch_threads)], env)
    failed = re.findall(r"^FAILED: (.*)$", output, re.M)
    ids = re.search(r"^chat template \+ tokenizer: (\d+)/(\d+) GSM8K prompts", output, re.M)
    exact = re.search(r"in float64 .*?= (\S+), through whale's LoRA adapter loaded by peft \S+ (\S+) \(tolerance", output)
    f32 = re.search(r"the same logits in f32: max \|whale - transformers\| = (\S+), through the adapter (\S+) "
                    r"\(tolerance ([^;]+); the adapter moves the logits by up to (\S+)\)", output)
    tokens = re.search(r"logits of a (\d+)-token sequence", output)
    if code not in (0, 1) or not (ids and exact and f32):
        rows.row("(c)+(d) hf_compare.py", False, f"exit {code}; output not as expected (see above)")
        return
    rows.row("(a) 64 GSM8K prompt ids", ids[1] == ids[2], f"{ids[1]}/{ids[2]}")
    spread = re.search(r"each against the float64 logits: transformers f32 (\S+), whale f32 ([^;\s]+)"
                       r"(?:; through the adapter, transformers f32 (\S+), whale f32 (\S+))?", output)
    own = re.search(r"transformers against itself in f32 \(its other attention kernel\): (\S+)", output)
    bound = float(f32[3])
    context = (f"{tokens[1]}-token chat" if tokens else "") + (
        f"; vs float64: transformers f32 {spread[1].rstrip(',')}, whale f32 {spread[2]}" if spread else "") + (
        f"; transformers eager vs sdpa {own[1]}" if own else "")
    rows.row("(c) logits float64", float(exact[1]) <= FLOAT64_TOLERANCE,
             f"max |difference| {exact[1]} (<= {FLOAT64_TOLERANCE:g})")
    rows.row("(c) logits f32", float(f32[1]) <= bound, f"max |difference| {f32[1]} (<= {bound:g}; {context})")
    rows.row("(d) adapter logits float64", float(exact[2]) <= FLOAT64_TOLERANCE,
             f"max |difference| {exact[2]} (<= {FLOAT64_TOLERANCE:g}), whale-trained LoRA loaded by peft")
    rows.row("(d) adapter logits f32", float(f32[2]) <= bound,
             f"max |difference| {f32[2]} (<= {bound:g}; the adapter moves the logits by up to {f32[4]}"
             + (f"; vs float64: transformers f32 {spread[3].rstrip(',')}, whale f32 {spread[4]}"
                if spread and spread[3] else "") + ")")
    if failed:
        rows.row("hf_compare.py's own verdict", False, "; ".join(failed))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=whale_home() / "models" / f"{NAME}.gguf")
    parser.add_argument("--model", type=Path, help="the converted directory (default: beside the GGUF, without .gguf)")
    parser.add_argument("--whale", default=str(REPO / "target" / "release" / "whale"))
    parser.add_argument("--tolerance", type=float, default=0.0, help="largest |difference| allowed per weight")
    parser.add_argument("--prompts", type=int, default=32, help="chat prompts per domain for (a), (b) and (e)")
    parser.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt for (b)")
    parser.add_argument("--min-greedy", type=int, help="prompts whose greedy tokens must agree (default: all but one)")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--llama-server", help="also run smollm2_greedy.py's llama.cpp comparison with this binary")
    parser.add_argument("--skip", default="", help="comma-separated checks to leave out: e, ab, cd")
    args = parser.parse_args()
    ensure_venv(__file__)
    try:
        import gguf  # noqa: F401
        import peft  # noqa: F401
        import safetensors  # noqa: F401
        import torch
        import transformers  # noqa: F401
    except ImportError as error:
        print(f"missing package: {error.name}; see the usage in {__file__}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.torch_threads)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    args.model = args.model or args.gguf.with_suffix("")
    if not (args.model / "config.json").is_file():
        if not args.gguf.is_file():
            print(f"{args.gguf} is missing: run `whale lm fetch qwen2.5-coder-0.5b` or pass --gguf", file=sys.stderr)
            return 2
        command = [args.whale, "lm", "convert", str(args.gguf), "-o", str(args.model)]
        print("running", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.torch_threads))
    rows, times, start = Rows(), [], time.perf_counter()
    for key, label, check in [("e", "(e) conversion", lambda: conversion(rows, args)),
                              ("ab", "(a)+(b) greedy", lambda: greedy(rows, args, env)),
                              ("cd", "(c)+(d) logits", lambda: logits(rows, args, env))]:
        if key in skip:
            continue
        began = time.perf_counter()
        print(f"== {label} ==", flush=True)
        if key == "e" and not args.gguf.is_file():
            rows.row(label, False, f"{args.gguf} is missing")
            continue
        rows.prefix = "(e) " if key == "e" else ""
        check()
        times.append((label, time.perf_counter() - began))
    print(f"\n== {args.model} beside transformers {transformers.__version__} ==")
    print("| check | result | detail |\n|---|---|---|")
    for name, ok, detail in rows.summary:
        print(f"| {name} | {'ok' if ok else 'FAIL'} | {detail} |")
    print("wall time: " + ", ".join(f"{label} {seconds:.0f} s" for label, seconds in times)
          + f"; total {time.perf_counter() - start:.0f} s")
    if rows.failed:
        print(f"FAILED: {', '.join(rows.failed)}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
