#!/usr/bin/env python3
"""whale beside Hugging Face transformers on the same checkpoint and the same inputs.

Checks, on a whale checkpoint (Qwen3, or Llama such as SmolLM2 from `whale lm convert`) loaded
with `AutoModelForCausalLM`:
  1. the tokenizer and chat template give the same token ids in both (64 GSM8K questions);
  2. the logits of a chat of two GSM8K turns (a few hundred tokens) agree, and so do they
     through a LoRA adapter that whale trains here and `peft` loads (the proof that whale's
     checkpoints and adapters are real Hugging Face and PEFT ones and that the two
     implementations compute the same model). Both sides compute them twice: in float64, where
     nothing rounds to f32 (transformers' rotary angles and RMSNorm, which it computes in f32
     whatever the dtype, are computed in float64 here), and they must agree within 1e-9; and in
     f32, within 1e-4, the bar of the 4-layer default model. Deeper models round more: at
     SmolLM2's 30 layers f32 runs differ by about 1e-4 even between transformers' own attention
     kernels. So an f32 difference above 1e-4 is measured against that: the script runs
     transformers with its other attention kernel, and the difference passes when the float64
     check passed and it is within twice what transformers moves by against itself;
then times, with the same prompts, sampling settings and batch:
  3. generation of 64 concurrent requests (whale's engine vs `model.generate` at batch 64; the
     median of 3 runs);
  4. one training step (completion-only cross-entropy, AdamW, clipping at 1.0) of the full
     weights, and one of a fresh LoRA adapter on all seven projections (whale's against
     transformers + peft);
and reports how much of the padded micro-batches is padding, and the first micro-batch's loss
in transformers padded and packed through position_ids (equal if its packing keeps examples apart).

Usage: python3 bench/hf_compare.py [--model DIR] [--max-tokens N] [--train-examples N] [--lora-rank R]
                                  [--torch-threads N] [--checks-only | --timings-only]
                                  [--no-full-weights]
The first run creates bench/.venv and installs torch, transformers, safetensors and peft from
PyPI into it (set WHALE_HF_VENV to reuse another virtual environment). Without --model it uses the
default base model, pretraining it first if it is not cached. With --checks-only it runs checks 1
and 2 and leaves the timings (3, 4 and the padding report) out, on both sides; with
--timings-only the reverse (for a model whose checks have their own script, such as
bench/qwen2_5_parity.py). --no-full-weights times the LoRA step alone (a model whose full-weight
step does not fit in memory on one side or the other). Exits 1 when a check fails.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("WHALE_HF_VENV", REPO / "bench" / ".venv"))
PACKAGES = ["torch", "transformers", "safetensors", "peft"]
LOGITS_TOLERANCE = 1e-4
FLOAT64_TOLERANCE = 1e-9
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
INSTRUCTION = "\nGive the final answer after ####."


def ensure_venv(script=__file__):
    """Re-runs `script` (this one by default) inside the virtual environment, creating it on
    first use; one named by WHALE_HF_VENV that exists is used as it is."""
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    installed = VENV / ".whale-installed"
    given = "WHALE_HF_VENV" in os.environ and python.exists()
    if not installed.exists() and not given:
        print(f"creating {VENV} and installing {' '.join(PACKAGES)} from PyPI ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
        installed.touch()
    os.execv(str(python), [str(python), script, *sys.argv[1:]])


def shared_data():
    env = os.environ.get("WHALE_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def default_model():
    home = Path(os.environ.get("WHALE_HOME", Path.home() / ".cache" / "whale"))
    model = home / "models" / "base-v1-seed0"
    if not (model / "config.json").exists():
        print("no cached base model; running `whale lm pretrain` first ...", flush=True)
        cargo(["run", "--release", "-p", "whale", "--", "lm", "pretrain"])
    return model


def cargo(args):
    subprocess.run(["cargo", *args], cwd=REPO, check=True)


def gsm8k(count, offset=0):
    path = shared_data() / "math" / "gsm8k" / "test.jsonl"
    with open(path, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    if len(records) < offset + count:
        sys.exit(f"{path}: {len(records)} records, need {offset + count}")
    return records[offset : offset + count]


def conversation(record):
    return [{"role": "user", "content": record["question"] + INSTRUCTION}]


def train_adapter(model_dir, records, scratch):
    """A LoRA adapter trained by `whale lm train` for a few steps on GSM8K solutions."""
    data = Path(scratch) / "sft.jsonl"
    with open(data, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps({"messages": conversation(record), "completion": record["answer"]}) + "\n")
    adapter = Path(scratch) / "adapter"
    cargo(["run", "--release", "--quiet", "-p", "whale", "--", "lm", "train", "--model", str(model_dir),
           "--data", str(data), "-o", str(adapter), "--lora-rank", "8", "--lr", "1e-2", "--batch", "8"])
    return adapter


def template_ids(tokenizer, conversation):
    """The prompt ids of `conversation` with the generation prompt, as transformers renders them
    (a plain list, whether this transformers returns a list or an encoding)."""
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)


def chat_logits_input(tokenizer, records):
    """The token ids of a real chat of a few hundred tokens: each record's question and its
    GSM8K solution as a user and an assistant turn, rendered by the chat template."""
    turns = [turn for r in records for turn in (*conversation(r), {"role": "assistant", "content": r["answer"]})]
    ids = tokenizer.apply_chat_template(turns, tokenize=True)
    return list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)


def build_workload(tokenizer, args):
    records = gsm8k(args.batch)
    conversations = [conversation(r) for r in records]
    chat_ids = [template_ids(tokenizer, c) for c in conversations]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = []
    for ids, record in zip(chat_ids[: args.train_examples], records):
        answer = tokenizer.encode(record["answer"], add_special_tokens=False)
        examples.append({"prompt": ids, "completion": answer[: args.train_completion_tokens] + [im_end]})
    return {
        "conversations": conversations,
        "logits_input": chat_logits_input(tokenizer, records[:2]),
        "generate": {"prompts": chat_ids, "max_tokens": args.max_tokens, "temperature": 1.0, "top_k": 20, "top_p": 1.0,
                     "repeats": args.repeats},
        "train": {"examples": examples, "micro_batch": args.micro_batch, "steps": args.train_steps,
                  "learning_rate": 1e-5, "lora_rank": args.lora_rank or None, "lora_alpha": 2.0 * args.lora_rank,
                  "full_weights": not args.no_full_weights},
    }


def run_whale(model_dir, workload, scratch):
    cargo(["build", "--release", "--quiet", "-p", "whale-train", "--example", "hf_peer"])
    peer = REPO / "target" / "release" / "examples" / "hf_peer"
    work, out = Path(scratch) / "workload.json", Path(scratch) / "out.json"
    work.write_text(json.dumps(workload))
    subprocess.run([str(peer), str(model_dir), str(work), str(out)], check=True)
    return json.loads(out.read_text())


def eos_ids(tokenizer, config):
    ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    eos = config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


def time_generation(torch, model, tokenizer, workload):
    spec = workload["generate"]
    prompts = spec["prompts"]
    eos = eos_ids(tokenizer, model.config)
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    settings = dict(do_sample=True, temperature=spec["temperature"], top_k=spec["top_k"], top_p=spec["top_p"],
                    eos_token_id=eos, pad_token_id=pad)
    with torch.no_grad():
        model.generate(input_ids=input_ids[:2], attention_mask=mask[:2], max_new_tokens=4, **settings)
        times = []
        for _ in range(max(1, spec["repeats"])):
            torch.manual_seed(0)
            start = time.perf_counter()
            output = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=spec["max_tokens"],
                                    **settings)
            times.append(time.perf_counter() - start)
        seconds = sorted(times)[len(times) // 2]
    tokens = 0
    for row in output[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        tokens += ends[0] + 1 if ends else len(row)
    return tokens, seconds


def time_training(torch, model, tokenizer, workload):
    """Micro-batches as whale's trainer forms them: longest first, padded to the longest in each,
    gradients accumulated over the step, the loss summed over all completion tokens."""
    spec = workload["train"]
    examples = sorted(spec["examples"], key=lambda e: -(len(e["prompt"]) + len(e["completion"])))
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    batches = [padded(torch, examples[i : i + spec["micro_batch"]], pad)
               for i in range(0, len(examples), spec["micro_batch"])]
    total = sum(len(e["completion"]) for e in examples)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=spec["learning_rate"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def step():
        optimizer.zero_grad()
        loss_sum = 0.0
        for input_ids, labels, mask in batches:
            logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
            summed = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
            (summed / total).backward()
            loss_sum += summed.item()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        return loss_sum / total

    step()
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        loss = step()
    seconds = (time.perf_counter() - start) / spec["steps"]
    positions = sum(len(e["prompt"]) + len(e["completion"]) - 1 for e in examples)
    return positions, seconds, loss


def time_lora_training(torch, model_dir, tokenizer, workload):
    """[`time_training`] of a fresh peft adapter of the workload's rank and alpha on the seven
    projections whale's adapters target, the base frozen."""
    import peft
    import transformers

    spec = workload["train"]
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=spec["lora_rank"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                             target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    return time_training(torch, peft.get_peft_model(base, config), tokenizer, workload)


def padded(torch, examples, pad):
    width = max(len(e["prompt"]) + len(e["completion"]) for e in examples)
    rows, labels, masks = [], [], []
    for e in examples:
        ids = e["prompt"] + e["completion"]
        rows.append(ids + [pad] * (width - len(ids)))
        labels.append([-100] * len(e["prompt"]) + e["completion"] + [-100] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    return torch.tensor(rows), torch.tensor(labels), torch.tensor(masks)


def padding_and_packing(torch, model, tokenizer, workload):
    """How much of the padded micro-batches is padding, and the first micro-batch's mean loss per
    completion token in transformers padded (attention mask) and packed end to end (position_ids
    restarting per example, no mask): equal when its packing keeps the examples apart."""
    spec = workload["train"]
    examples = sorted(spec["examples"], key=lambda e: -(len(e["prompt"]) + len(e["completion"])))
    chunks = [examples[i : i + spec["micro_batch"]] for i in range(0, len(examples), spec["micro_batch"])]
    lengths = [[len(e["prompt"]) + len(e["completion"]) - 1 for e in chunk] for chunk in chunks]
    padded_positions = sum(max(chunk) * len(chunk) for chunk in lengths)
    tokens = sum(sum(chunk) for chunk in lengths)
    first, pad = chunks[0], tokenizer.convert_tokens_to_ids("<|endoftext|>")
    completion = sum(len(e["completion"]) for e in first)

    def mean_loss(logits, labels):
        logits = logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100, reduction="sum").item() / completion

    with torch.no_grad():
        input_ids, labels, mask = padded(torch, first, pad)
        padded_loss = mean_loss(model(input_ids=input_ids, attention_mask=mask).logits, labels)
        ids = [t for e in first for t in e["prompt"] + e["completion"]]
        positions = [p for e in first for p in range(len(e["prompt"]) + len(e["completion"]))]
        packed_labels = [t for e in first for t in [-100] * len(e["prompt"]) + e["completion"]]
        packed_loss = mean_loss(model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions])).logits,
                                torch.tensor([packed_labels]))
    return padded_positions, tokens, padded_loss, packed_loss


def plain_rotary(config):
    """Whether `config`'s rotary embedding is unscaled, the one `exact_float64` computes."""
    parameters = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    return parameters.get("rope_type", "default") == "default" and scaling.get("rope_type", "default") == "default"


def exact_float64(torch, model):
    """`model` (with a plain rotary embedding) in float64 with nothing rounded to f32:
    transformers computes the rotary angles and RMSNorm in f32 whatever the dtype, so both are
    replaced by their float64 formulas (the frequencies `1 / theta^(2i / d)`)."""
    import types

    config = model.config
    parameters = getattr(config, "rope_parameters", None) or {}
    theta = parameters.get("rope_theta") or config.rope_theta
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def rotary(self, x, position_ids):
        angles = position_ids[..., None].double() * inverse
        both = torch.cat((angles, angles), dim=-1)
        return both.cos().to(x.dtype), both.sin().to(x.dtype)

    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    model = model.double()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_norm, module)
        elif type(module).__name__.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rotary, module)
    return model.eval()


def own_spread(torch, model, model_dir, ids, logits):
    """How far transformers' f32 `logits` of `ids` from `model` move with its other attention
    kernel (eager against sdpa): the f32 rounding two correct implementations differ by."""
    import transformers

    other = "sdpa" if model.config._attn_implementation == "eager" else "eager"
    variant = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                                attn_implementation=other).eval()
    with torch.no_grad():
        return (variant(input_ids=torch.tensor([ids])).logits[0] - logits).abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a whale / Hugging Face checkpoint directory")
    parser.add_argument("--batch", type=int, default=64, help="concurrent generation requests")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens each generation request asks for")
    parser.add_argument("--train-examples", type=int, default=16, help="examples in the training step")
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="examples per forward/backward pass in both (whale's default micro-batch)")
    parser.add_argument("--train-completion-tokens", type=int, default=96)
    parser.add_argument("--train-steps", type=int, default=3, help="timed training steps (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="timed generation runs; the median counts")
    parser.add_argument("--lora-rank", type=int, default=16,
                        help="rank of the adapter of the LoRA training step (alpha twice it); 0 leaves it out")
    parser.add_argument("--torch-threads", type=int,
                        help="torch's intra-op threads (default: torch's own choice); on 2 vCPUs 1 can be faster")
    parser.add_argument("--checks-only", action="store_true",
                        help="only the token-id and logits checks: no generation or training timings")
    parser.add_argument("--timings-only", action="store_true",
                        help="only the generation and training timings: no token-id or logits checks")
    parser.add_argument("--no-full-weights", action="store_true",
                        help="time the LoRA step alone, not a step of the full weights")
    args = parser.parse_args()
    if args.checks_only and args.timings_only:
        parser.error("--checks-only and --timings-only exclude each other")
    ensure_venv()
    if args.timings_only:
        timings_only(args)
        return

    import peft
    import torch
    import transformers

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    model_dir = args.model or default_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    workload = build_workload(tokenizer, args)
    workload["float64"] = plain_rotary(model.config)
    chat_ids = workload["generate"]["prompts"]
    if args.checks_only:  # whale's peer leaves out what the workload does not ask for
        del workload["generate"], workload["train"]
    inputs = torch.tensor([workload["logits_input"]])
    with tempfile.TemporaryDirectory() as scratch:
        workload["adapter"] = str(train_adapter(model_dir, gsm8k(32, offset=args.batch), scratch))
        ours = run_whale(model_dir, workload, scratch)

        def fresh():
            return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

        with torch.no_grad():
            theirs = model(input_ids=inputs).logits[0]
            theirs_adapted = peft.PeftModel.from_pretrained(fresh(), workload["adapter"])(input_ids=inputs).logits[0]
            exact = exact_float64(torch, fresh()) if workload["float64"] else None
            if exact is not None:
                exact_logits = exact(input_ids=inputs).logits[0]
                exact_adapted = peft.PeftModel.from_pretrained(exact, workload["adapter"]).double()
                exact_adapted_logits = exact_adapted(input_ids=inputs).logits[0]

    failures = []
    same_ids = sum(a == b for a, b in zip(ours["chat_ids"], chat_ids))
    if same_ids != len(workload["conversations"]):
        failures.append(f"chat template + tokenizer: {same_ids}/{len(workload['conversations'])} prompts identical")
    ours_logits, ours_adapted = torch.tensor(ours["logits"]), torch.tensor(ours["adapter_logits"])
    f32_rows = {"base": (theirs, ours_logits), "through the adapter": (theirs_adapted, ours_adapted)}
    f32_differences = {name: (a.double() - b).abs().max().item() for name, (a, b) in f32_rows.items()}
    float64_differences = {}
    if exact is not None:
        float64_rows = {"base": (exact_logits, ours["logits_f64"]),
                        "through the adapter": (exact_adapted_logits, ours["adapter_logits_f64"])}
        float64_differences = {name: (a - torch.tensor(b, dtype=torch.float64)).abs().max().item()
                               for name, (a, b) in float64_rows.items()}
    for name, difference in float64_differences.items():
        if not difference <= FLOAT64_TOLERANCE:
            failures.append(f"float64 logits ({name}) differ by {difference:.3g} > {FLOAT64_TOLERANCE}")
    exact_agrees = bool(float64_differences) and all(d <= FLOAT64_TOLERANCE for d in float64_differences.values())
    spread, f32_bound = None, LOGITS_TOLERANCE
    if max(f32_differences.values()) > LOGITS_TOLERANCE:
        spread = own_spread(torch, model, model_dir, workload["logits_input"], theirs)
        if exact_agrees:
            f32_bound = max(LOGITS_TOLERANCE, 2 * spread)
    for name, difference in f32_differences.items():
        if not difference <= f32_bound:
            failures.append(f"f32 logits ({name}) differ by {difference:.3g} > {f32_bound:.3g}")
    adapter_effect = (theirs_adapted - theirs).abs().max().item()
    if not adapter_effect > 100 * LOGITS_TOLERANCE:
        failures.append(f"the trained adapter moves the logits by only {adapter_effect:.3g}; the check proves nothing")

    if not args.checks_only:
        theirs_timed = hf_timings(torch, model, model_dir, tokenizer, workload, args)

    params = sum(p.numel() for p in model.parameters())
    print(f"model: {model_dir} ({params / 1e6:.2f}M parameters), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} torch threads")
    print(f"chat template + tokenizer: {same_ids}/{len(workload['conversations'])} GSM8K prompts give identical ids")
    tokens_in = len(workload["logits_input"])
    if float64_differences:
        print(f"logits of a {tokens_in}-token sequence in float64 (nothing rounded to f32): max |whale - transformers|"
              f" = {float64_differences['base']:.2e}, through whale's LoRA adapter loaded by peft {peft.__version__}"
              f" {float64_differences['through the adapter']:.2e} (tolerance {FLOAT64_TOLERANCE:g})")
    else:
        print("float64 logits: not compared (a scaled rotary embedding)")
    print(f"the same logits in f32: max |whale - transformers| = {f32_differences['base']:.2e}, through the adapter "
          f"{f32_differences['through the adapter']:.2e} (tolerance {f32_bound:.3g}; the adapter moves the logits by "
          f"up to {adapter_effect:.2f})")
    if exact is not None:
        print(f"  each against the float64 logits: transformers f32 {(theirs.double() - exact_logits).abs().max():.2e},"
              f" whale f32 {(ours_logits.double() - exact_logits).abs().max():.2e}; through the adapter, transformers f32"
              f" {(theirs_adapted.double() - exact_adapted_logits).abs().max():.2e},"
              f" whale f32 {(ours_adapted - exact_adapted_logits).abs().max():.2e}")
    if spread is not None:
        print(f"  transformers against itself in f32 (its other attention kernel): {spread:.2e}")
    if not args.checks_only:
        print_timings(args, ours, theirs_timed)
    for failure in failures:
        print(f"FAILED: {failure}")
    sys.exit(1 if failures else 0)


def hf_timings(torch, model, model_dir, tokenizer, workload, args):
    """transformers' side of the timings: generation, the training steps the workload asks for,
    and the padding report."""
    timed = {"generate": time_generation(torch, model, tokenizer, workload)}
    if workload["train"]["full_weights"]:
        timed["train"] = time_training(torch, model, tokenizer, workload)
    if args.lora_rank:
        timed["lora"] = time_lora_training(torch, model_dir, tokenizer, workload)
    timed["padding"] = padding_and_packing(torch, model.eval(), tokenizer, workload)
    return timed


def timings_only(args):
    """The timings without the checks: whale's and transformers' generation and training steps."""
    import torch
    import transformers

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model_dir = args.model or default_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    workload = build_workload(tokenizer, args)
    del workload["logits_input"]
    with tempfile.TemporaryDirectory() as scratch:
        ours = run_whale(model_dir, workload, scratch)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    theirs = hf_timings(torch, model, model_dir, tokenizer, workload, args)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {model_dir} ({params / 1e6:.2f}M parameters), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} torch threads")
    print_timings(args, ours, theirs)


def print_timings(args, ours, theirs):
    """The table of tokens/s, whale beside transformers (and peft), and the padding report."""
    import peft

    gen_tokens, gen_seconds = theirs["generate"]
    ours_gen = ours["generate_tokens"] / ours["generate_seconds"]
    hf_gen = gen_tokens / gen_seconds
    print("| workload | whale (candle) | transformers (torch) | whale / transformers |")
    print("|---|---:|---:|---:|")
    print(f"| generate, {args.batch} concurrent, up to {args.max_tokens} new tokens: tokens/s "
          f"| {ours_gen:.0f} ({ours['generate_tokens']} in {ours['generate_seconds']:.2f} s) "
          f"| {hf_gen:.0f} ({gen_tokens} in {gen_seconds:.2f} s) | {ours_gen / hf_gen:.2f}x |")
    batch = f"{args.train_examples} examples in micro-batches of {args.micro_batch}"
    steps = [
        ("train", "training step", "train", ""),
        ("lora", f"LoRA rank {args.lora_rank} training step", "lora_train", f" with peft {peft.__version__}"),
    ]
    # (transformers' timing, the row's label, whale's keys' prefix, what the peer runs with)
    for key, label, prefix, peer in steps:
        if key not in theirs:
            continue
        positions, seconds, loss = theirs[key]
        ours_rate = ours["train_positions"] / ours[f"{prefix}_seconds_per_step"]
        theirs_rate = positions / seconds
        print(f"| {label}, {batch}: tokens/s "
              f"| {ours_rate:.0f} ({ours[f'{prefix}_seconds_per_step']:.3f} s/step, loss {ours[f'{prefix}_loss']:.3f}) "
              f"| {theirs_rate:.0f}{peer} ({seconds:.3f} s/step, loss {loss:.3f}) | {ours_rate / theirs_rate:.2f}x |")
    padded_positions, tokens, padded_loss, packed_loss = theirs["padding"]
    print(f"training micro-batches padded: {padded_positions} positions for {tokens} tokens "
          f"({1 - tokens / padded_positions:.0%} padding; whale packs the tokens end to end)")
    print(f"transformers' packing (position_ids, no attention mask), first micro-batch: mean loss "
          f"{packed_loss:.3f} packed vs {padded_loss:.3f} padded")


if __name__ == "__main__":
    main()
