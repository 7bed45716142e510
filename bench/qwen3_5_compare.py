#!/usr/bin/env python3
"""whale's Qwen3.5 beside Hugging Face transformers on tiny random checkpoints.

Builds, with transformers, a tiny random Qwen3.5 (three Gated DeltaNet layers and one gated
full-attention layer, every parameter moved off its initial value) in both layouts:
`Qwen3_5ForCausalLM` (model_type qwen3_5_text) and the multimodal
`Qwen3_5ForConditionalGeneration` (model_type qwen3_5, text weights under
model.language_model., a one-block vision tower whale ignores). On each it checks:
  1. whale's logits of a 300-token sequence (five delta-rule chunks of 64) equal transformers'
     within 1e-4;
  2. greedy decoding through whale's cached step (prefill, then one token at a time through the
     convolution window, the delta-rule state and the KV cache) equals transformers' `generate`
     token for token;
  3. (text layout) a LoRA adapter of every Qwen3.5 module that whale trains here loads in `peft`,
     and the logits through it equal whale's within 1e-4;
then times that greedy decode and one training step (next-token loss, AdamW) in both.

vLLM serving the same checkpoints is bench/qwen3_5_vllm.py's (its CPU kernel of the delta rule runs bf16 only).

Usage: python3 bench/qwen3_5_compare.py
The first run creates bench/.venv and installs torch, transformers, safetensors and peft from
PyPI, as bench/hf_compare.py does (set WHALE_HF_VENV to use another virtual environment whose
transformers has Qwen3.5, e.g. the one of scripts/vllm-venv.sh). Exits 1 when a check fails.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from hf_compare import LOGITS_TOLERANCE, ensure_venv  # noqa: E402  (one venv for both scripts)

VOCAB = 512
GREEDY_TOKENS = 40


def text_config():
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, tie_word_embeddings=False, eos_token_id=None, pad_token_id=None,
    )


def perturb(model, seed):
    """Moves every parameter off its initialisation, so that norms, gates and decays matter."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            spread = 0.5 if ("norm" in name or "A_log" in name) else 0.15
            parameter.add_((torch.rand(parameter.shape, generator=generator) * 2 - 1) * spread)


def build(kind, directory):
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    if kind == "text":
        model = Qwen3_5ForCausalLM(text_config())
    else:
        vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                      patch_size=16, spatial_merge_size=2, temporal_patch_size=2)
        config = Qwen3_5Config(text_config=text_config().to_dict(), vision_config=vision,
                               tie_word_embeddings=False)
        model = Qwen3_5ForConditionalGeneration(config)
    perturb(model, seed=1 if kind == "text" else 2)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def workload(seed, adapter_dir):
    import torch

    generator = torch.Generator().manual_seed(seed)
    tokens = lambda n: torch.randint(0, VOCAB, (n,), generator=generator).tolist()
    return {
        "logits_input": tokens(300),
        "greedy_prompts": [tokens(20)],
        "greedy_tokens": GREEDY_TOKENS,
        "train_sequences": [tokens(128) for _ in range(4)],
        "train_steps": 3,
        "adapter_dir": str(adapter_dir) if adapter_dir else None,
    }


def run_whale(model_dir, work, scratch):
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "whale-lm", "--example", "qwen3_5_peer"],
                   cwd=REPO, check=True)
    peer = REPO / "target" / "release" / "examples" / "qwen3_5_peer"
    work_file, out_file = scratch / "workload.json", scratch / "whale.json"
    work_file.write_text(json.dumps(work))
    subprocess.run([str(peer), str(model_dir), str(work_file), str(out_file)], check=True)
    return json.loads(out_file.read_text())


def transformers_side(model, work):
    import torch
    from peft import PeftModel

    ids = torch.tensor([work["logits_input"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    prompt = torch.tensor(work["greedy_prompts"][:1])
    started = time.perf_counter()
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=work["greedy_tokens"], min_new_tokens=work["greedy_tokens"],
                                   eos_token_id=None, pad_token_id=0)
    greedy_seconds = time.perf_counter() - started
    greedy = generated[0, prompt.shape[1]:].tolist()
    adapter_logits = None
    if work["adapter_dir"]:
        adapted = PeftModel.from_pretrained(model, work["adapter_dir"])
        with torch.no_grad():
            adapter_logits = adapted(input_ids=ids).logits[0].float()
        model = adapted.unload()
        for parameter in model.parameters():
            parameter.requires_grad_(True)  # peft froze the base
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sequences = torch.tensor(work["train_sequences"])
    started = time.perf_counter()
    for _ in range(work["train_steps"]):
        out = model(input_ids=sequences[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), sequences[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    step_seconds = (time.perf_counter() - started) / work["train_steps"]
    model.eval()
    return logits, greedy, greedy_seconds, step_seconds, adapter_logits


def main():
    ensure_venv(__file__)
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failed = False
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for index, kind in enumerate(["text", "multimodal"]):
            model_dir = scratch / kind
            model = build(kind, model_dir)
            work = workload(seed=10 + index, adapter_dir=scratch / f"{kind}-adapter" if kind == "text" else None)
            ours = run_whale(model_dir, work, scratch)
            logits, greedy, greedy_seconds, step_seconds, adapter_logits = transformers_side(model, work)
            difference = (torch.tensor(ours["logits"]) - logits).abs().max().item()
            same_greedy = ours["greedy"][0] == greedy
            print(f"{kind}: logits of {len(work['logits_input'])} tokens, max |whale - transformers| = "
                  f"{difference:.2e} (tolerance {LOGITS_TOLERANCE:.0e}); greedy {GREEDY_TOKENS} tokens "
                  f"{'equal' if same_greedy else 'DIFFER'}")
            if not same_greedy:
                print(f"  whale        {ours['greedy'][0]}\n  transformers {greedy}")
            failed |= difference > LOGITS_TOLERANCE or not same_greedy
            if adapter_logits is not None:
                through = (torch.tensor(ours["adapter_logits"]) - adapter_logits).abs().max().item()
                moved = (adapter_logits - logits).abs().max().item()
                print(f"{kind}: through whale's LoRA adapter loaded by peft, max |whale - transformers| = "
                      f"{through:.2e} (the adapter moves the logits by up to {moved:.2f})")
                failed |= through > LOGITS_TOLERANCE
            rows.append((kind, ours["greedy_seconds"], greedy_seconds, ours["train_step_seconds"], step_seconds))
    print("\n| checkpoint | greedy 40 tokens: whale | transformers | train step: whale | transformers |")
    print("|---|---|---|---|---|")
    for kind, ours_greedy, theirs_greedy, ours_step, theirs_step in rows:
        print(f"| {kind} | {ours_greedy:.3f} s | {theirs_greedy:.3f} s | {ours_step:.3f} s | {theirs_step:.3f} s |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
