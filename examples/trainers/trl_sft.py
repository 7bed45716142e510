#!/usr/bin/env python3
"""Train a LoRA adapter on the samples of one WHALE weight step, with TRL's SFTTrainer.

whale's weight phase with an external trainer writes the kept rollouts' model calls to
`runs/<name>/weights/step-NNNNNN/samples.jsonl`, one JSON object per line:

    {"messages": [{"role": "system", ...}, {"role": "user", ...}, ...,
                  {"role": "assistant", "content": "<the completion>"}],
     "trainable": [false, false, ..., true],
     "finish_reason": "stop"}

This script tokenizes each line the way whale's own trainer (`whale lm train`) does, and trains
exactly the tokens it trains (docs/scale-out.md, "Which tokens are trained"):

- the prompt is every message before the last trainable turn, rendered by the tokenizer's chat
  template with the generation prompt, as the model saw it when it answered;
- the trained tokens are that assistant turn's content, tokenized on its own, followed by the
  template's end-of-turn token when the reply ended its turn (finish_reason "stop"), and nothing
  after it: whatever the template writes after the end-of-turn token (ChatML's newline) is
  never sampled by the server and is not trained.

TRL's own prompt-completion split would take everything after the generation prompt, the
template's trailing newline included: a token after end-of-sequence that, on whale's tiny model,
carried nine tenths of the loss. So the script hands TRL pre-tokenized `input_ids` and a
`completion_mask`. It trains a LoRA adapter on the base model (or continues the previous step's
adapter), and saves it in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`)
into --output, which is what whale waits for and then hot-loads into vLLM, SGLang or
`whale serve`.

As the [weights.trainer] of a run config (paths relative to the config file's directory):

    [weights.trainer]
    command = ["python", "trainers/trl_sft.py", "--data", "{data}", "--base", "{base}",
               "--previous", "{previous}", "--output", "{output}",
               "--lr", "1e-5", "--epochs", "1", "--lora-rank", "16"]
    output = "adapter"

On several GPUs, the same arguments under a launcher (DeepSpeed or FSDP come from the
accelerate config file; see docs/scale-out.md):

    accelerate launch --config_file deepspeed_zero2.yaml trainers/trl_sft.py --data ...
    torchrun --nproc-per-node 8 trainers/trl_sft.py --data ...

By hand, on whale's tiny base model (CPU, seconds):

    python examples/trainers/trl_sft.py --data samples.jsonl \\
        --base ~/.cache/whale/models/base-v1-seed0 --output /tmp/adapter

For a server that loads full checkpoints (SGLang's /update_weights_from_disk, output =
"checkpoint"), --merge writes the adapter folded into the weights instead, and --previous is
then the previous step's checkpoint, on which a fresh adapter is trained.

Every option (learning rate, epochs, LoRA rank / alpha / dropout / target modules, batch size,
gradient accumulation, maximum length, warm-up, weight decay, clipping, seed, precision,
gradient checkpointing): `python trl_sft.py --help`.

Notes:
- --previous is the last update's adapter (whale passes an empty string before the first
  update): its weights are trained further. The optimizer starts afresh each step (whale's own
  trainer carries AdamW's moments across steps; use it where that matters).
- A completion cut off at max_tokens (finish_reason "length") is trained without the
  end-of-turn token, as it was sampled; whale's default `weights.skip_truncated = true` leaves
  such calls out of samples.jsonl altogether.
- --trained-tokens FILE writes each sample's prompt ids and the ids TRL's labels train, one JSON
  line per sample; `scripts/trainer_agreement.py` compares them with `whale lm train`'s.
- --batch-size is per device; the effective batch is batch size x gradient accumulation x
  devices (the paper's mini-batch of 64: e.g. 8 GPUs x 8, or 8 GPUs x 2 x 4 accumulation).
"""

import argparse
import json
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
    parser.add_argument("--epochs", type=float, default=1.0, help="passes over the samples (default 1)")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank r (default 16)")
    parser.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 x rank)")
    parser.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout (default 0)")
    parser.add_argument(
        "--target-modules",
        default=TARGET_MODULES,
        help=f"comma-separated, or all-linear for every linear layer but the output (default {TARGET_MODULES})",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="examples per device per step (default 8)")
    parser.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps (default 1)")
    parser.add_argument("--max-length", type=int, default=8192, help="tokens per example; longer lose their end")
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="training precision (auto: bfloat16 on a GPU that has it, else float32)",
    )
    parser.add_argument("--gradient-checkpointing", action="store_true", help="trade compute for activation memory")
    parser.add_argument(
        "--metrics",
        type=Path,
        default=None,
        help='also write {"loss": L} here, L the mean training loss (pass whale\'s {metrics} placeholder)',
    )
    parser.add_argument(
        "--trained-tokens",
        type=Path,
        default=None,
        help="also write each sample's prompt ids and trained ids (from TRL's labels) here, one JSON line each",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="write a full checkpoint (the adapter merged into the weights) for output = \"checkpoint\"; "
        "--previous is then the previous step's checkpoint, which a fresh adapter trains on",
    )
    return parser.parse_args(argv)


def read_samples(path):
    """The prompt-completion conversations of a samples.jsonl; a bad line stops with file:line."""
    records = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(prompt_completion(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                sys.exit(f"{path}:{number}: {error}")
    if not records:
        sys.exit(f"{path}: no samples")
    return records


def prompt_completion(sample):
    """The context messages, the reply to learn, and whether the reply ended its turn."""
    if "advantage" in sample:
        raise ValueError("a policy-gradient sample (GRPO / RLOO): train these with pg_transformers.py")
    messages, trainable = sample["messages"], sample["trainable"]
    if not isinstance(messages, list) or not isinstance(trainable, list) or len(messages) != len(trainable):
        raise ValueError("`messages` and `trainable` must be lists of the same length")
    turns = [i for i, flag in enumerate(trainable) if flag is True]
    if not turns:
        raise ValueError("no trainable turn")
    last = turns[-1]
    if messages[last].get("role") != "assistant":
        raise ValueError(f"the trainable turn {last} is a {messages[last].get('role')!r} message, not the assistant's")
    finish = sample.get("finish_reason", "stop")
    if finish not in ("stop", "length"):
        raise ValueError(f"finish_reason {finish!r}: expected \"stop\" or \"length\"")
    context = [{"role": m["role"], "content": m["content"]} for m in messages[:last]]
    return {"context": context, "reply": messages[last]["content"], "ends_turn": finish == "stop"}


def template_ids(tokenizer, messages, generation_prompt):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def end_of_turn_id(tokenizer, context):
    """The token the chat template writes right after an assistant reply: the first special token
    of what follows the reply's text (ChatML's `<|im_end|>`, not the newline after it)."""
    marker = "whale-reply-marker"
    prompt = tokenizer.apply_chat_template(context, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(
        context + [{"role": "assistant", "content": marker}], add_generation_prompt=False, tokenize=False
    )
    if not whole.startswith(prompt) or marker not in whole[len(prompt) :]:
        raise ValueError("the chat template does not render a reply right after its generation prompt")
    after = whole[len(prompt) :].split(marker, 1)[1]
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    for token in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if token in special:
            return token
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the chat template writes {after!r} after a reply: no special token to end the turn")
    return tokenizer.eos_token_id


def trained_example(tokenizer, record):
    """`input_ids` and `completion_mask` (1 on the trained tokens) of one sample, as whale makes them."""
    prompt = template_ids(tokenizer, record["context"], generation_prompt=True)
    reply = list(tokenizer(record["reply"], add_special_tokens=False)["input_ids"])
    if record["ends_turn"]:
        reply.append(end_of_turn_id(tokenizer, record["context"]))
    return {"input_ids": prompt + reply, "completion_mask": [0] * len(prompt) + [1] * len(reply)}


def write_trained_tokens(path, trainer):
    """Each example's prompt ids and trained ids as the collator hands them to the loss."""
    with open(path, "w", encoding="utf-8") as out:
        for example in trainer.train_dataset:
            labels = trainer.data_collator([example])["labels"][0].tolist()
            ids = example["input_ids"]
            first = next((i for i, label in enumerate(labels) if label != -100), len(ids))
            trained = [label for label in labels if label != -100]
            out.write(json.dumps({"prompt_ids": ids[:first], "trained_ids": trained}) + "\n")


def target_modules(spec):
    """PEFT's `all-linear`, or the comma-separated module names."""
    if spec == "all-linear":
        return spec
    return [name.strip() for name in spec.split(",") if name.strip()]


def main(argv=None):
    args = parse_args(argv)
    samples = read_samples(args.data)

    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    bf16 = args.dtype == "bfloat16" or (
        args.dtype == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    )
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    start = args.previous if args.merge and args.previous else args.base
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.bfloat16 if bf16 else torch.float32)
    peft_config = None
    if args.previous and not args.merge:
        model = PeftModel.from_pretrained(model, args.previous, is_trainable=True)
    else:
        peft_config = LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha if args.lora_alpha is not None else 2 * args.lora_rank,
            lora_dropout=args.lora_dropout,
            target_modules=target_modules(args.target_modules),
            task_type="CAUSAL_LM",
        )
    config = SFTConfig(
        output_dir=str(args.output),
        completion_only_loss=True,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        max_length=args.max_length,
        bf16=bf16,
        use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=args.gradient_checkpointing,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
    )
    examples = [trained_example(tokenizer, record) for record in samples]
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    if args.trained_tokens is not None and trainer.is_world_process_zero():
        write_trained_tokens(args.trained_tokens, trainer)
    result = trainer.train()
    if args.merge:
        save_merged(trainer, tokenizer, args.output)
    else:
        trainer.save_model(str(args.output))
    if trainer.is_world_process_zero():
        if args.metrics is not None:
            args.metrics.write_text(json.dumps({"loss": result.training_loss}), encoding="utf-8")
        what = "checkpoint" if args.merge else "adapter"
        start = args.previous or "a fresh adapter"
        print(f"trained on {len(samples)} samples from {start}, loss {result.training_loss:.4f}; {what} in {args.output}")


def save_merged(trainer, tokenizer, output):
    """The adapter folded into the weights, saved as a Hugging Face checkpoint by the main process.
    Every process must hold whole weights (one process, DDP or ZeRO-2; not FSDP or ZeRO-3)."""
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
        merged.save_pretrained(str(output), safe_serialization=True)
        # The chat template stays in tokenizer_config.json, where every reader finds it.
        tokenizer.save_pretrained(str(output), save_jinja_files=False)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
