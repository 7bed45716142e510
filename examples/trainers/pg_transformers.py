#!/usr/bin/env python3
"""Train a LoRA adapter on one WHALE policy-gradient step (GRPO or RLOO) with transformers + peft.

Under `[weights] algorithm = "grpo"` or `"rloo"`, whale's weight phase with an external trainer
writes every trainable model call of the step's rollouts to
`runs/<name>/weights/step-NNNNNN/samples.jsonl`, one JSON object per line:

    {"messages": [..., {"role": "assistant", "content": "<the completion>"}],
     "trainable": [false, ..., true], "finish_reason": "stop",
     "advantage": 0.87, "group": 3, "rollout": 13,
     "completion_token_ids": [...], "behaviour_logprobs": [...]}

`advantage` is the rollout's (its reward against the other rollouts of its task, `group`),
`completion_token_ids` the tokens as sampled (the end-of-turn token included when one was
sampled) and `behaviour_logprobs` the sampler's log-probability of each. The prompt is every
message before the completion, rendered with the tokenizer's chat template and a generation
prompt, exactly as the policy saw it.

The loss is PPO's token-level clipped surrogate, averaged over a mini-batch's completion
tokens (verl's "token-mean"), as whale's own trainer computes it:

    ratio_t = exp(logp_t - old_t)
    loss    = mean_t -min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A)

`old_t` is recomputed with the step's starting weights before the first update (verl's
`old_log_prob`); `--old-logprobs sampler` uses the sampler's `behaviour_logprobs` instead. The
script prints the largest |exp(old - sampler) - 1|: a large value means the trainer does not
start from the weights the server sampled with.

As the [weights.trainer] of a run config (paths relative to the config file's directory):

    [weights.trainer]
    command = ["python", "trainers/pg_transformers.py", "--data", "{data}", "--base", "{base}",
               "--previous", "{previous}", "--output", "{output}", "--metrics", "{metrics}",
               "--lr", "1e-5", "--lora-rank", "16"]
    output = "adapter"

By hand, on whale's tiny base model (CPU, seconds):

    python examples/trainers/pg_transformers.py --data samples.jsonl \\
        --base ~/.cache/whale/models/base-v1-chess-seed0 --output /tmp/adapter

The trained tokens are exactly the sampled ones, `completion_token_ids`: the reply as the server
sampled it, its end-of-turn token included when one was sampled and nothing the chat template
writes after it, which is what whale's own trainer trains (docs/scale-out.md, "Which tokens
are trained"). --trained-tokens FILE writes each sample's prompt ids and trained ids, one JSON
line per sample, for `scripts/trainer_agreement.py` to compare with `whale lm train`'s.

Notes:
- --previous is the last update's adapter (empty before the first update); its weights are
  trained further. The optimizer starts afresh each step (whale's own trainer carries AdamW's
  moments across steps).
- whale's own trainer also offers a KL penalty to the starting weights
  (`[weights.policy_gradient] kl_coef`); this script does not.
"""

import argparse
import json
import math
import random
import sys
from pathlib import Path

TARGET_MODULES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the step's samples.jsonl")
    parser.add_argument("--base", required=True, help="the base model: a directory or a hub id")
    parser.add_argument("--previous", default="", help="the previous step's adapter (empty: a fresh adapter)")
    parser.add_argument("--output", required=True, type=Path, help="where the adapter is written")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the samples (default 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per optimizer update (default 64)")
    parser.add_argument("--clip-epsilon", type=float, default=0.2, help="PPO's clip range (default 0.2)")
    parser.add_argument(
        "--old-logprobs",
        choices=["recompute", "sampler"],
        default="recompute",
        help="the ratio's denominator: recomputed with the starting weights (default), or the sampler's",
    )
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank r (default 16)")
    parser.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 x rank)")
    parser.add_argument("--target-modules", default=TARGET_MODULES, help=f"comma-separated (default {TARGET_MODULES})")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trained-tokens", type=Path, default=None, help="also write each sample's prompt ids and trained ids here"
    )
    parser.add_argument(
        "--metrics", type=Path, default=None, help='also write {"loss": L} here (pass whale\'s {metrics} placeholder)'
    )
    return parser.parse_args(argv)


def read_samples(path):
    """The policy-gradient samples of a samples.jsonl; a bad line stops with file:line."""
    samples = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                samples.append(policy_gradient_sample(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                sys.exit(f"{path}:{number}: {error}")
    if not samples:
        sys.exit(f"{path}: no samples")
    return samples


def policy_gradient_sample(sample):
    messages, trainable = sample["messages"], sample["trainable"]
    if len(messages) != len(trainable) or trainable[-1] is not True or messages[-1]["role"] != "assistant":
        raise ValueError("the last message must be the trainable assistant reply")
    if "advantage" not in sample:
        raise ValueError("no `advantage`: this is a supervised sample (use trl_sft.py)")
    advantage = float(sample["advantage"])
    ids, old = sample["completion_token_ids"], sample["behaviour_logprobs"]
    if not math.isfinite(advantage) or not ids or len(ids) != len(old):
        raise ValueError("`advantage` must be finite and `behaviour_logprobs` one per completion token")
    context = [{"role": m["role"], "content": m["content"]} for m in messages[:-1]]
    return {"context": context, "completion": [int(t) for t in ids], "sampler": [float(x) for x in old],
            "advantage": advantage}


def completion_logprobs(model, torch, prompt, completion):
    """log p(completion_t | prompt, completion_<t) for each completion token (differentiable)."""
    ids = torch.tensor([prompt + completion], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    targets = torch.tensor(completion, device=model.device)
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def main(argv=None):
    args = parse_args(argv)
    samples = read_samples(args.data)

    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    if args.previous:
        model = PeftModel.from_pretrained(model, args.previous, is_trainable=True)
    else:
        targets = [name.strip() for name in args.target_modules.split(",") if name.strip()]
        alpha = args.lora_alpha if args.lora_alpha is not None else 2 * args.lora_rank
        config = LoraConfig(r=args.lora_rank, lora_alpha=alpha, target_modules=targets, task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
    if torch.cuda.is_available():
        model = model.cuda()

    for sample in samples:
        sample["prompt"] = tokenizer.apply_chat_template(sample["context"], add_generation_prompt=True, tokenize=True)
        if hasattr(sample["prompt"], "input_ids"):
            sample["prompt"] = sample["prompt"]["input_ids"]
    if args.trained_tokens is not None:
        with open(args.trained_tokens, "w", encoding="utf-8") as out:
            for sample in samples:
                out.write(json.dumps({"prompt_ids": list(sample["prompt"]), "trained_ids": sample["completion"]}) + "\n")
    model.eval()
    gap = 0.0
    with torch.no_grad():
        for sample in samples:
            old = completion_logprobs(model, torch, sample["prompt"], sample["completion"]).tolist()
            gap = max([gap] + [abs(math.exp(o - s) - 1.0) for o, s in zip(old, sample["sampler"])])
            sample["old"] = old if args.old_logprobs == "recompute" else sample["sampler"]
    print(f"{len(samples)} samples; largest |p_trainer / p_sampler - 1| before training: {gap:.2e}", flush=True)

    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    low, high = 1.0 - args.clip_epsilon, 1.0 + args.clip_epsilon
    order = list(range(len(samples)))
    rng = random.Random(args.seed)
    loss_sum, token_sum, clipped_sum, update = 0.0, 0, 0, 0
    for _ in range(args.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), args.batch_size):
            batch = [samples[i] for i in order[start : start + args.batch_size]]
            tokens = sum(len(s["completion"]) for s in batch)
            optimizer.zero_grad()
            batch_loss, batch_clipped = 0.0, 0
            for sample in batch:
                logp = completion_logprobs(model, torch, sample["prompt"], sample["completion"])
                old = torch.tensor(sample["old"], device=logp.device)
                ratio = torch.exp(logp - old)
                advantage = sample["advantage"]
                unclipped, clipped = ratio * advantage, ratio.clamp(low, high) * advantage
                loss = -torch.minimum(unclipped, clipped).sum() / tokens
                loss.backward()
                batch_loss += loss.item() * tokens
                batch_clipped += int((clipped < unclipped).sum().item())
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            update += 1
            loss_sum, token_sum, clipped_sum = loss_sum + batch_loss, token_sum + tokens, clipped_sum + batch_clipped
            print(
                f"update {update}: loss {batch_loss / tokens:.4f}, clip fraction {batch_clipped / tokens:.3f} "
                f"({tokens} tokens)",
                flush=True,
            )

    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.output), safe_serialization=True)
    if args.metrics is not None:
        args.metrics.write_text(json.dumps({"loss": loss_sum / max(token_sum, 1)}))
    print(f"wrote {args.output}", flush=True)


if __name__ == "__main__":
    main()
