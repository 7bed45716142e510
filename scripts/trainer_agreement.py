#!/usr/bin/env python3
"""Checks that an external trainer trains exactly what `whale lm train` trains, on one weight
step's samples.jsonl: the same token ids of every sample, and the same first-step loss.

    python scripts/trainer_agreement.py --samples runs/NAME/weights/step-000001/samples.jsonl \\
        --base MODEL_DIR --whale target/release/whale

Supervised samples are compared with examples/trainers/trl_sft.py, policy-gradient samples
(those with an `advantage`) with examples/trainers/pg_transformers.py; the trainers run with
this script's Python, which needs torch, transformers and peft (and trl for supervised data).
Each trainer takes one update over all the samples (a LoRA adapter, rank 8), so its first
step's loss is the mean over every trained token at the starting weights, where a fresh
adapter adds nothing. Exits 1 unless, for every sample, the prompt ids and the trained ids are
equal, and the two losses agree within --tolerance (relative, default 1%). Prints one table.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", required=True, type=Path, help="a weight step's samples.jsonl")
    parser.add_argument("--base", required=True, help="the base model's checkpoint directory")
    parser.add_argument("--whale", default=str(ROOT / "target/release/whale"), help="the whale binary")
    parser.add_argument("--work", type=Path, default=None, help="where the trainers write (default: a temp dir)")
    parser.add_argument("--tolerance", type=float, default=0.01, help="relative loss tolerance (default 0.01)")
    return parser.parse_args(argv)


def is_policy_gradient(samples):
    with open(samples, encoding="utf-8") as lines:
        first = next(json.loads(line) for line in lines if line.strip())
    return "advantage" in first


def run(command, log):
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"trainer_agreement: {command[0]} {command[1]} failed (rc {done.returncode}); log: {log}")


def train_with_whale(args, count, work):
    out = work / "whale"
    command = [args.whale, "lm", "train", "--model", args.base, "--data", str(args.samples), "-o", str(out / "adapter"),
               "--lora-rank", "8", "--lora-alpha", "16", "--batch", str(count), "--lr", "1e-6", "--keep-order",
               "--metrics", str(out / "metrics.json"), "--trained-tokens", str(out / "tokens.jsonl")]
    out.mkdir(parents=True, exist_ok=True)
    run(command, out / "train.log")
    return out


def train_externally(args, count, work, policy_gradient):
    name = "pg_transformers.py" if policy_gradient else "trl_sft.py"
    out = work / name.removesuffix(".py")
    command = [sys.executable, str(ROOT / "examples/trainers" / name), "--data", str(args.samples), "--base", args.base,
               "--output", str(out / "adapter"), "--lora-rank", "8", "--batch-size", str(count), "--lr", "1e-6",
               "--metrics", str(out / "metrics.json"), "--trained-tokens", str(out / "tokens.jsonl")]
    out.mkdir(parents=True, exist_ok=True)
    run(command, out / "train.log")
    return name, out


def read_tokens(path):
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def loss(out):
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))["loss"]


def compare_tokens(ours, theirs):
    """The first sample whose prompt or trained ids differ, as a message; None when all agree."""
    if len(ours) != len(theirs):
        return f"{len(ours)} samples trained by whale, {len(theirs)} by the other trainer"
    for index, (a, b) in enumerate(zip(ours, theirs)):
        for field in ("prompt_ids", "trained_ids"):
            if a[field] != b[field]:
                return f"sample {index + 1}: {field} differ: whale {a[field][-8:]} ... other {b[field][-8:]} (last 8)"
    return None


def main(argv=None):
    args = parse_args(argv)
    count = sum(1 for line in open(args.samples, encoding="utf-8") if line.strip())
    policy_gradient = is_policy_gradient(args.samples)
    work = args.work or Path(tempfile.mkdtemp(prefix="whale-trainer-agreement."))
    ours = train_with_whale(args, count, work)
    name, theirs = train_externally(args, count, work, policy_gradient)
    tokens_ours, tokens_theirs = read_tokens(ours / "tokens.jsonl"), read_tokens(theirs / "tokens.jsonl")
    mismatch = compare_tokens(tokens_ours, tokens_theirs)
    loss_ours, loss_theirs = loss(ours), loss(theirs)
    gap = abs(loss_ours - loss_theirs) / max(abs(loss_ours), abs(loss_theirs), 1e-6)
    trained = sum(len(t["trained_ids"]) for t in tokens_ours)
    print(f"{'trainer':<20} {'samples':>7} {'trained tokens':>14} {'first-step loss':>15}")
    print(f"{'whale lm train':<20} {count:>7} {trained:>14} {loss_ours:>15.6f}")
    other_trained = sum(len(t["trained_ids"]) for t in tokens_theirs)
    print(f"{name:<20} {len(tokens_theirs):>7} {other_trained:>14} {loss_theirs:>15.6f}")
    print(f"relative loss gap {gap:.2e} (tolerance {args.tolerance:.0e}); token ids {'equal' if mismatch is None else 'DIFFER'}")
    failures = ([mismatch] if mismatch else []) + ([f"loss gap {gap:.2e}"] if gap > args.tolerance else [])
    if failures:
        sys.exit(f"trainer_agreement: FAILED: {'; '.join(failures)} (work files in {work})")
    print(f"trainer_agreement: {name} trains what whale lm train trains (work files in {work})")


if __name__ == "__main__":
    main()
