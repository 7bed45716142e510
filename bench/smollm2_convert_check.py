#!/usr/bin/env python3
"""`whale lm convert` beside transformers' own GGUF loader, on SmolLM2-135M-Instruct.

transformers loads a GGUF by dequantizing it to float and undoing llama.cpp's rotary row order
(`AutoModelForCausalLM.from_pretrained(DIR, gguf_file=NAME)`). whale's converted directory must
hold the same model. Checks, each printed as a row:
  1. every tensor: the same names, shapes and values (max |difference| <= --tolerance, default 0);
  2. the config: layers, sizes, heads, rope theta, RMS epsilon, vocabulary, tied embeddings,
     special token ids;
  3. the logits of one chat prompt, the converted directory loaded as a plain
     `LlamaForCausalLM` against the GGUF loaded by transformers (within 1e-4);
  4. the chat template: `apply_chat_template` renders the same text from both;
  5. token ids of a few texts from the converted `tokenizer.json` and from transformers' GGUF
     tokenizer. They agree except where a run of spaces precedes a digit: SmolLM2's own
     tokenizer (and llama.cpp's "smollm" pre-tokenizer, and whale's) splits every digit first,
     transformers' GGUF tokenizer does not. Those texts are printed, not failed; the ids whale
     gives for them are checked against SmolLM2's split.
Exits 1 when a check fails, 2 when a package is missing.

Usage: python bench/smollm2_convert_check.py [--gguf FILE] [--converted DIR] [--whale BIN]
Without --gguf it takes $WHALE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf (`whale lm fetch
smollm2` puts it there); without --converted it runs `WHALE convert` into a temporary directory.
Needs torch, transformers (5.x), gguf and safetensors, e.g.
  python3 -m venv ~/.cache/whale-venvs/gguf
  ~/.cache/whale-venvs/gguf/bin/pip install torch transformers gguf safetensors
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LOGITS_TOLERANCE = 1e-4
CHAT = [
    {"role": "system", "content": "You are a careful assistant. Answer briefly."},
    {"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then half as many in May. "
     "How many clips did she sell altogether?"},
    {"role": "assistant", "content": "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in all."},
    {"role": "user", "content": "And if she sells 10% more in June than in May?"},
]
TEXTS = [
    "Hello, world! 2024 was a good year.",
    "naïve café — 東京 🐳, 12 + 30 = 42",
    "def solve(x):\n    return x * 2\n",
    "<|im_start|>user\nWhat is 12*12?<|im_end|>\n",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
]
# Spaces before a digit, and the ids of SmolLM2's own split (digits first).
DIGIT_SPLIT_TEXTS = {"x   1": [104, 333, 33], "   3 spaces then 7": [333, 35, 5600, 965, 216, 39]}


def whale_home():
    if os.environ.get("WHALE_HOME"):
        return Path(os.environ["WHALE_HOME"])
    return Path.home() / ".cache" / "whale" if os.environ.get("HOME") else Path(".whale")


def imports():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import gguf  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as error:
        print(f"missing package: {error.name}; see the usage in {__file__}", file=sys.stderr)
        sys.exit(2)


class Checks:
    def __init__(self):
        self.failed = []

    def row(self, name, ok, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {name:<28} {detail}", flush=True)
        if not ok:
            self.failed.append(name)


def compare_tensors(checks, reference, converted, tied, tolerance):
    expected = {name for name in reference if not (tied and name == "lm_head.weight")}
    missing, extra = sorted(expected - set(converted)), sorted(set(converted) - expected)
    checks.row("tensor names", not missing and not extra,
               f"{len(converted)} tensors; missing {missing[:3]}, extra {extra[:3]}")
    worst, worst_name, shapes_ok = 0.0, None, True
    for name in sorted(expected & set(converted)):
        ours, theirs = converted[name].float(), reference[name].float()
        if ours.shape != theirs.shape:
            shapes_ok = False
            print(f"     {name}: shape {tuple(ours.shape)} vs {tuple(theirs.shape)}")
            continue
        difference = (ours - theirs).abs().max().item()
        if difference > worst:
            worst, worst_name = difference, name
    checks.row("tensor shapes", shapes_ok, "all equal" if shapes_ok else "see above")
    checks.row("tensor values", worst <= tolerance, f"max |difference| {worst:.3g} ({worst_name or 'every tensor equal'})")
    q = "model.layers.0.self_attn.q_proj.weight"
    if q in converted and q in reference:
        print(f"     {q}: first row {converted[q][0, :4].tolist()} vs {reference[q][0, :4].tolist()}")


def compare_config(checks, reference, converted):
    def rope_theta(config):
        parameters = getattr(config, "rope_parameters", None) or {}
        return parameters.get("rope_theta", getattr(config, "rope_theta", None))

    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"]
    differing = [(key, getattr(reference, key, None), getattr(converted, key, None)) for key in keys
                 if getattr(reference, key, None) != getattr(converted, key, None)]
    if rope_theta(reference) != rope_theta(converted):
        differing.append(("rope_theta", rope_theta(reference), rope_theta(converted)))
    if abs(reference.rms_norm_eps - converted.rms_norm_eps) > 1e-6 * reference.rms_norm_eps:
        differing.append(("rms_norm_eps", reference.rms_norm_eps, converted.rms_norm_eps))
    checks.row("config", not differing, f"differs: {differing}" if differing else
               f"{converted.num_hidden_layers} layers, hidden {converted.hidden_size}, "
               f"{converted.num_attention_heads}/{converted.num_key_value_heads} heads, "
               f"vocab {converted.vocab_size}, tied {converted.tie_word_embeddings}")


def compare_logits(checks, reference_model, converted_model, ids):
    import torch

    with torch.no_grad():
        theirs = reference_model(torch.tensor([ids])).logits[0]
        ours = converted_model(torch.tensor([ids])).logits[0]
    difference = (ours - theirs).abs().max().item()
    same_argmax = bool((ours.argmax(-1) == theirs.argmax(-1)).all())
    checks.row("logits", difference <= LOGITS_TOLERANCE and same_argmax,
               f"{len(ids)} tokens, max |difference| {difference:.3g}, same argmax {same_argmax}")


def compare_tokenizers(checks, reference, converted):
    rendered = [t.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) for t in (reference, converted)]
    checks.row("chat template", rendered[0] == rendered[1], f"{len(rendered[1])} characters rendered")
    texts = TEXTS + [rendered[1]]
    differing = [text for text in texts if reference.encode(text, add_special_tokens=False)
                 != converted.encode(text, add_special_tokens=False)]
    checks.row("token ids", not differing, f"{len(texts)} texts; differing: {differing}")
    for text, smollm2_ids in DIGIT_SPLIT_TEXTS.items():
        ours, theirs = converted.encode(text, add_special_tokens=False), reference.encode(text, add_special_tokens=False)
        checks.row(f"digit split {text!r}", ours == smollm2_ids,
                   f"converted {ours} (SmolLM2's {smollm2_ids}); transformers' GGUF tokenizer {theirs}")
    return converted.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)


def convert(whale, gguf_file, into):
    command = [whale, "lm", "convert", str(gguf_file), "-o", str(into)]
    print("running", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=whale_home() / "models" / GGUF_NAME)
    parser.add_argument("--converted", type=Path, help="a directory `whale lm convert` wrote")
    parser.add_argument("--whale", default=str(REPO / "target" / "release" / "whale"))
    parser.add_argument("--tolerance", type=float, default=0.0, help="largest |difference| allowed per weight")
    args = parser.parse_args()
    imports()
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    if not args.gguf.is_file():
        print(f"{args.gguf} is missing: run `whale lm fetch smollm2` or pass --gguf", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        converted_dir = args.converted
        if converted_dir is None:
            converted_dir = Path(scratch) / "converted"
            convert(args.whale, args.gguf, converted_dir)
        gguf_dir, gguf_name = str(args.gguf.parent), args.gguf.name
        print(f"loading {args.gguf} with transformers ...", flush=True)
        reference = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()
        converted = AutoModelForCausalLM.from_pretrained(converted_dir, dtype=torch.float32).eval()
        checks = Checks()
        weights = load_file(str(Path(converted_dir) / "model.safetensors"))
        compare_tensors(checks, reference.state_dict(), weights, converted.config.tie_word_embeddings, args.tolerance)
        compare_config(checks, reference.config, converted.config)
        ids = compare_tokenizers(checks, AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name),
                                 AutoTokenizer.from_pretrained(converted_dir))
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        compare_logits(checks, reference, converted, list(ids))
    if checks.failed:
        print(f"FAILED: {', '.join(checks.failed)}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
