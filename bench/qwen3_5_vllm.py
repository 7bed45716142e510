#!/usr/bin/env python3
"""Greedy decoding of whale's Qwen3.5 beside vLLM's CPU build and transformers, on one checkpoint.

Builds a tiny random Qwen3.5 (`Qwen3_5ForCausalLM`: three Gated DeltaNet layers, one gated
full-attention layer, every parameter moved off its initialisation) in the shapes vLLM's CPU
kernel of the gated delta rule accepts (linear head dims of 128). Then, on two checkpoints:
  - the random model itself, decoding 8 random prompts;
  - the same model trained by whale (full weights, `crates/whale-lm/examples/qwen3_5_peer.rs`)
    on chains of a fixed random permutation of the vocabulary (each token followed by its
    image), decoding 8 prompts of that kind. A random model's top two logits often lie closer
    together than bf16 rounding moves them, so there the greedy choice is a coin that rounding
    tosses; a trained model, like a released one, has margins that rounding cannot flip;
it decodes each prompt greedily for 32 tokens with:
  - whale (its cached decoding step) in f32 and bf16;
  - transformers `generate` in f32 and bf16;
  - vLLM 0.32's CPU build (offline `LLM`, no tokenizer, in a child process), in bf16: its
    delta-rule kernel runs in bf16 only, so vLLM has no f32 run to compare with an f32 reference.
It prints, for each pair, how many of the 8 completions are equal token for token and the mean
number of tokens before the first difference; the smallest and the median gap between the top
two logits over transformers' f32 greedy steps; then, on a 128-token sequence, the largest gap
between the log-probabilities each gives the sequence's own next tokens (vLLM's prompt logprobs).

Exits 1 when whale and transformers differ in f32 on either checkpoint (the check of
qwen3_5_compare.py), or when, on the trained checkpoint, any two of the five runs differ. On the
random checkpoint the bf16 pairs are measurements, not checks.

Usage: python3 bench/qwen3_5_vllm.py   (needs the venv of scripts/vllm-venv.sh; about 5 minutes)
(`--vllm MODEL_DIR IN.json OUT.json` is the child process that runs vLLM.)
"""

import copy
import json
import math
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
# The trained checkpoint: whale's full-weight AdamW steps over permutation chains (the script
# prints the last step's loss: 0.010 here, against ln 512 = 6.24 for a uniform guess).
TRAIN_STEPS = 150
TRAIN_BATCH = 8
TRAIN_LENGTH = 96
TRAIN_LR = 3e-3


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
    """transformers' greedy tokens of `prompts`, and the gap between the top two logits at every
    step."""
    import torch

    model = copy.deepcopy(model).to(dtype)  # a copy: casting in place would round the weights
    out, margins = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                       eos_token_id=None, pad_token_id=0, output_logits=True,
                                       return_dict_in_generate=True)
            out.append(generated.sequences[0, len(prompt):].tolist())
            for logits in generated.logits:
                top = torch.topk(logits[0].float(), 2).values
                margins.append((top[0] - top[1]).item())
    return out, margins


def build_peer():
    """Builds whale's half of the workloads (qwen3_5_peer.rs), once per run of this script."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "whale-lm", "--example", "qwen3_5_peer"],
                   cwd=REPO, check=True)


def whale_peer(model_dir, work, scratch, name):
    """Runs whale's half of a workload (see qwen3_5_peer.rs) and returns its output."""
    work = {"logits_input": [], "greedy_prompts": [], "greedy_tokens": NEW_TOKENS, "train_sequences": [],
            "train_steps": 0, "adapter_dir": None, **work}
    work_file, out_file = scratch / f"work-{name}.json", scratch / f"whale-{name}.json"
    work_file.write_text(json.dumps(work))
    peer = REPO / "target" / "release" / "examples" / "qwen3_5_peer"
    subprocess.run([str(peer), str(model_dir), str(work_file), str(out_file)], check=True)
    return json.loads(out_file.read_text())


def whale_run(model_dir, prompts, sequence, dtype, scratch):
    """whale's greedy tokens of `prompts` and its logits of `sequence`."""
    out = whale_peer(model_dir, {"logits_input": sequence, "greedy_prompts": prompts, "dtype": dtype}, scratch,
                     f"{model_dir.name}-{dtype}")
    return out["greedy"], out["logits"]


def whale_train(model_dir, trained_dir, sequences, scratch):
    """Trains every weight of `model_dir` on `sequences` in whale and saves it in `trained_dir`."""
    work = {"train_sequences": sequences, "train_steps": TRAIN_STEPS, "train_batch": TRAIN_BATCH,
            "train_lr": TRAIN_LR, "save_dir": str(trained_dir)}
    out = whale_peer(model_dir, work, scratch, "train")
    print(f"whale trained {TRAIN_STEPS} steps of {TRAIN_BATCH} x {TRAIN_LENGTH} tokens: last loss "
          f"{out['train_loss']:.3f} (ln {VOCAB} = {math.log(VOCAB):.2f}), {out['train_step_seconds']:.3f} s a step")


def chains(generator, permutation, count, length):
    """`count` sequences of `length` tokens, each from a random start, each token followed by
    its image under `permutation`."""
    import torch

    out = []
    for _ in range(count):
        sequence = [torch.randint(0, VOCAB, (1,), generator=generator).item()]
        while len(sequence) < length:
            sequence.append(permutation[sequence[-1]])
        out.append(sequence)
    return out


def vllm_run(model_dir, prompts, sequence, scratch):
    """vLLM's greedy tokens of `prompts` and its log-probabilities of `sequence`'s own tokens,
    from a child process (one engine per process)."""
    work_file, out_file = scratch / f"vllm-in-{model_dir.name}.json", scratch / f"vllm-{model_dir.name}.json"
    work_file.write_text(json.dumps({"prompts": prompts, "sequence": sequence}))
    subprocess.run([sys.executable, __file__, "--vllm", str(model_dir), str(work_file), str(out_file)], check=True)
    out = json.loads(out_file.read_text())
    return out["greedy"], out["own"]


def vllm_child(model_dir, work_file, out_file):
    work = json.loads(Path(work_file).read_text())
    greedy, own = vllm_generate(model_dir, work["prompts"], work["sequence"])
    Path(out_file).write_text(json.dumps({"greedy": greedy, "own": own}))


def vllm_generate(model_dir, prompts, sequence):
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


def measure(title, model, model_dir, prompts, sequence, scratch):
    """Decodes `prompts` with the five runs, prints the tables and returns the runs' tokens."""
    import torch

    (whale_f32, whale_f32_logits), (whale_bf16, whale_bf16_logits) = (
        whale_run(model_dir, prompts, sequence, dtype, scratch) for dtype in ["f32", "bf16"])
    vllm, vllm_own = vllm_run(model_dir, prompts, sequence, scratch)
    transformers_f32, margins = transformers_greedy(model, prompts, torch.float32)
    runs = {
        "whale f32": whale_f32,
        "whale bf16": whale_bf16,
        "transformers f32": transformers_f32,
        "transformers bf16": transformers_greedy(model, prompts, torch.bfloat16)[0],
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
    margins.sort()
    print(f"\n## {title}: {PROMPTS} prompts of 20 tokens, {NEW_TOKENS} greedy tokens each")
    print(f"gap between the top two logits over transformers' f32 greedy steps: smallest "
          f"{margins[0]:.4f}, median {margins[len(margins) // 2]:.4f}\n")
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
    return runs


def main():
    if sys.argv[1:2] == ["--vllm"]:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return vllm_child(*sys.argv[2:5])
    ensure_venv()
    import torch
    from transformers import Qwen3_5ForCausalLM

    build_peer()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    generator = torch.Generator().manual_seed(21)
    prompts = [torch.randint(0, VOCAB, (20,), generator=generator).tolist() for _ in range(PROMPTS)]
    sequence = torch.randint(0, VOCAB, (128,), generator=generator).tolist()
    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model_dir, trained_dir = scratch / "qwen3.5-tiny", scratch / "qwen3.5-tiny-trained"
        model = build(model_dir)
        runs = measure("Random checkpoint", model, model_dir, prompts, sequence, scratch)
        if runs["whale f32"] != runs["transformers f32"]:
            failures.append("random checkpoint: whale f32 and transformers f32 differ")

        permutation = torch.randperm(VOCAB, generator=generator).tolist()
        whale_train(model_dir, trained_dir, chains(generator, permutation, TRAIN_STEPS * TRAIN_BATCH, TRAIN_LENGTH),
                    scratch)
        trained = Qwen3_5ForCausalLM.from_pretrained(trained_dir, dtype=torch.float32).eval()
        runs = measure("Checkpoint trained by whale", trained, trained_dir, chains(generator, permutation, PROMPTS, 20),
                       chains(generator, permutation, 1, 128)[0], scratch)
        names = list(runs)
        failures += [f"trained checkpoint: {a} and {b} differ" for i, a in enumerate(names) for b in names[i + 1:]
                     if runs[a] != runs[b]]
    for failure in failures:
        print(f"FAILED: {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
