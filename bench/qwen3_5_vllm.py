#!/usr/bin/env python3
"""Greedy decoding of whale's Qwen3.5 beside vLLM's CPU build and transformers, on one checkpoint.

Builds a tiny random Qwen3.5 (`Qwen3_5ForCausalLM`: three Gated DeltaNet layers, one gated
full-attention layer, every parameter moved off its initialisation) in the shapes vLLM's CPU
kernel of the gated delta rule accepts (linear head dims of 128), then decodes 8 random prompts
greedily for 32 tokens with:
  - whale (its cached decoding step, `crates/whale-lm/examples/qwen3_5_peer.rs`) in f32 and bf16;
  - transformers `generate` in f32 and bf16;
  - vLLM 0.32's CPU build (offline `LLM`, no tokenizer), in bf16: its delta-rule kernel runs in
    bf16 only, so vLLM has no f32 run to compare with an f32 reference.
It prints, for each pair, how many of the 8 completions are equal token for token and the mean
number of tokens before the first difference; then, on a 128-token sequence, the largest gap
between the log-probabilities each gives the sequence's own next tokens (vLLM's prompt logprobs). Exits 1 when whale and transformers differ in f32
(the same check as qwen3_5_compare.py); the bf16 pairs are measurements, not checks.

Usage: python3 bench/qwen3_5_vllm.py   (needs the venv of scripts/vllm-venv.sh, about 4 minutes)
"""

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("WHALE_VLLM_VENV", Path.home() / ".cache" / "whale-venvs" / "vllm"))
VOCAB = 512
PROMPTS = 8
NEW_TOKENS = 32


def ensure_venv():
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not python.exists():
        subprocess.run([str(REPO / "scripts" / "vllm-venv.sh")], check=True)
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


def build(directory):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    sys.path.insert(0, str(REPO / "bench"))
    from qwen3_5_compare import perturb

    config = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
        eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).to(torch.float32)
    perturb(model, seed=3)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def transformers_greedy(model, prompts, dtype):
    import torch

    model = copy.deepcopy(model).to(dtype)  # a copy: casting in place would round the weights
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                       eos_token_id=None, pad_token_id=0)
            out.append(generated[0, len(prompt):].tolist())
    return out


def whale_run(model_dir, prompts, sequence, dtype, scratch):
    """whale's greedy tokens of `prompts` and its logits of `sequence`."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "whale-lm", "--example", "qwen3_5_peer"],
                   cwd=REPO, check=True)
    work = {"logits_input": sequence, "greedy_prompts": prompts, "greedy_tokens": NEW_TOKENS,
            "train_sequences": [], "train_steps": 0, "adapter_dir": None, "dtype": dtype}
    work_file, out_file = scratch / f"work-{dtype}.json", scratch / f"whale-{dtype}.json"
    work_file.write_text(json.dumps(work))
    peer = REPO / "target" / "release" / "examples" / "qwen3_5_peer"
    subprocess.run([str(peer), str(model_dir), str(work_file), str(out_file)], check=True)
    out = json.loads(out_file.read_text())
    return out["greedy"], out["logits"]


def vllm_run(model_dir, prompts, sequence):
    """vLLM's greedy tokens of `prompts` and its log-probabilities of `sequence`'s own tokens."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16", seed=0,
              max_model_len=1024, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, ignore_eos=True,
                            detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    scored = llm.generate([TokensPrompt(prompt_token_ids=sequence)],
                          SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False))
    own = [step[token].logprob for step, token in zip(scored[0].prompt_logprobs[1:], sequence[1:])]
    return [list(output.outputs[0].token_ids) for output in outputs], own


def own_logprobs(logits, sequence):
    """The log-probability that each position's logits give the sequence's next token."""
    import torch

    log_probs = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float32), dim=-1)
    return [log_probs[i, token].item() for i, token in enumerate(sequence[1:])]


def transformers_logits(model, sequence, dtype):
    import torch

    with torch.no_grad():
        return copy.deepcopy(model).to(dtype)(input_ids=torch.tensor([sequence])).logits[0].float()


def agreement(a, b):
    """(completions equal token for token, mean tokens before the first difference)."""
    prefixes = []
    for x, y in zip(a, b):
        same = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        prefixes.append(same)
    return sum(1 for x, y in zip(a, b) if x == y), sum(prefixes) / len(prefixes)


def main():
    ensure_venv()
    import torch

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    generator = torch.Generator().manual_seed(21)
    prompts = [torch.randint(0, VOCAB, (20,), generator=generator).tolist() for _ in range(PROMPTS)]
    sequence = torch.randint(0, VOCAB, (128,), generator=generator).tolist()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model_dir = scratch / "qwen3.5-tiny"
        model = build(model_dir)
        (whale_f32, whale_f32_logits), (whale_bf16, whale_bf16_logits) = (
            whale_run(model_dir, prompts, sequence, dtype, scratch) for dtype in ["f32", "bf16"])
        vllm, vllm_own = vllm_run(model_dir, prompts, sequence)
        runs = {
            "whale f32": whale_f32,
            "whale bf16": whale_bf16,
            "transformers f32": transformers_greedy(model, prompts, torch.float32),
            "transformers bf16": transformers_greedy(model, prompts, torch.bfloat16),
            "vLLM bf16": vllm,
        }
        own = {
            "whale f32": own_logprobs(whale_f32_logits, sequence),
            "whale bf16": own_logprobs(whale_bf16_logits, sequence),
            "transformers f32": own_logprobs(transformers_logits(model, sequence, torch.float32), sequence),
            "transformers bf16": own_logprobs(transformers_logits(model, sequence, torch.bfloat16), sequence),
            "vLLM bf16": vllm_own,
        }
    pairs = [("whale f32", "transformers f32"), ("whale bf16", "transformers bf16"), ("whale bf16", "vLLM bf16"),
             ("transformers bf16", "vLLM bf16"), ("whale f32", "vLLM bf16"), ("transformers f32", "vLLM bf16")]
    print(f"\n{PROMPTS} prompts of 20 tokens, {NEW_TOKENS} greedy tokens each\n")
    print("| pair | equal completions | mean tokens before the first difference |")
    print("|---|---:|---:|")
    for a, b in pairs:
        equal, prefix = agreement(runs[a], runs[b])
        print(f"| {a} vs {b} | {equal}/{PROMPTS} | {prefix:.1f} |")
    print(f"\n| pair | max gap in the log-probabilities of a {len(sequence)}-token sequence's own tokens |")
    print("|---|---:|")
    for a, b in pairs:
        gap = max(abs(x - y) for x, y in zip(own[a], own[b]))
        print(f"| {a} vs {b} | {gap:.4f} |")
    equal, _ = agreement(runs["whale f32"], runs["transformers f32"])
    sys.exit(0 if equal == PROMPTS else 1)


if __name__ == "__main__":
    main()
