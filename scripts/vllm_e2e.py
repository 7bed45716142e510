#!/usr/bin/env python3
"""The checks of scripts/vllm-e2e.sh that talk HTTP or build files; run with the vLLM venv's python.

    parity URL_A URL_B MODEL --tasks FILE [--prompts N] [--max-tokens N] [--differs-from M] [--differs-from-url U]
        the same greedy chat requests to two OpenAI-compatible servers; every prompt's and
        completion's token ids must be equal (vLLM's `return_token_ids`, which whale serve honours),
        and (with --differs-from) some completion must differ from model M's (at U), so that the
        weights compared are not the ones they were trained from
    sft-data TASKS OUT [--n N]
        `whale lm train` data from GSM8K-style lines: the question, then the gold answer after ####
    adapters URL PREFIX EXPECTED
        the adapters the server lists whose name starts with PREFIX must be exactly EXPECTED
    agree RUN REFERENCE [REFERENCE ...]
        RUN's final test mean (metrics.jsonl) must lie in the 99% prediction interval of a new
        run drawn from the REFERENCE runs' final means (replicates of one configuration on the
        same test tasks that differ only in their rollout seeds): what two runs of one
        configuration differ by includes the sampling of their training rollouts, which a
        paired interval over the test tasks leaves out; the paired difference against the first
        reference and each run's final minus start are printed beside it
    search RUN
        the run's search iterations completed, each with an agent session that ended without error
    losses RUN
        every weight step of the run that trained (updates > 0) carries the trainer's loss
    copy SRC DST [--untie] [--positions N]
        a copy of a checkpoint: with --untie its own lm_head.weight and tie_word_embeddings false;
        with --positions, max_position_embeddings N (rotary positions past those trained on)
    qwen35 TOKENIZER_DIR DST
        a tiny random Qwen3.5 (linear and full attention layers) with whale's tokenizer
"""

import argparse
import json
import random
import shutil
import sys
import urllib.request
from pathlib import Path


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.load(reply)


def questions(tasks, count):
    lines = [json.loads(line) for line in Path(tasks).read_text().splitlines() if line.strip()]
    return [line["question"] for line in lines[:count]]


def greedy(url, model, question, max_tokens):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{question}\nGive the final answer after ####."}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "return_token_ids": True,
    }
    reply = post(f"{url}/chat/completions", body)
    return reply.get("prompt_token_ids"), reply["choices"][0]["token_ids"]


def parity(args):
    prompts = questions(args.tasks, args.prompts)
    equal = 0
    for number, question in enumerate(prompts):
        prompt_a, tokens_a = greedy(args.url_a, args.model, question, args.max_tokens)
        prompt_b, tokens_b = greedy(args.url_b, args.model, question, args.max_tokens)
        if None not in (prompt_a, prompt_b) and prompt_a != prompt_b:
            sys.exit(f"prompt {number}: the servers tokenised it differently: {prompt_a} vs {prompt_b}")
        if tokens_a == tokens_b:
            equal += 1
            continue
        first = next((i for i, (a, b) in enumerate(zip(tokens_a, tokens_b)) if a != b), min(len(tokens_a), len(tokens_b)))
        print(f"prompt {number}: the completions part at token {first}: {tokens_a} vs {tokens_b}")
    print(f"greedy parity on {args.model}: {equal}/{len(prompts)} completions equal token for token")
    if equal != len(prompts):
        sys.exit(1)
    if args.differs_from or args.differs_from_url:
        other_url, other_model = args.differs_from_url or args.url_b, args.differs_from or args.model
        changed = sum(
            greedy(args.url_b, args.model, q, args.max_tokens)[1] != greedy(other_url, other_model, q, args.max_tokens)[1]
            for q in prompts
        )
        print(f"{changed}/{len(prompts)} completions differ from {other_model} at {other_url}")
        if changed == 0:
            sys.exit("the weights under test answer exactly as the weights they were trained from")


def sft_data(args):
    lines = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    with open(args.out, "w") as out:
        for line in lines[: args.n]:
            answer = line["answer"].split("####")[-1].strip()
            messages = [{"role": "user", "content": f"{line['question']}\nGive the final answer after ####."}]
            out.write(json.dumps({"messages": messages, "completion": f"#### {answer}"}) + "\n")
    print(f"{args.n} examples in {args.out}")


def adapters(args):
    with urllib.request.urlopen(f"{args.url}/models", timeout=60) as reply:
        names = [model["id"] for model in json.load(reply)["data"]]
    mine = sorted(name for name in names if name.startswith(args.prefix))
    print(f"adapters of {args.prefix}* loaded: {mine}")
    if mine != [args.expected]:
        sys.exit(f"expected only {args.expected} (every earlier adapter unloaded), the server lists {names}")


# Student's t at 0.995 (a two-sided 99% interval) for 1 to 10 degrees of freedom.
T_99 = [63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169]


def evaluations(run):
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    found = [row for row in rows if row.get("kind") == "evaluation"]
    if not found:
        sys.exit(f"{run}: no test evaluation in metrics.jsonl")
    return found


def mean(values):
    return sum(values) / len(values)


def paired(a, b):
    differences = [x - y for x, y in zip(a, b)]
    rng = random.Random(0)
    means = sorted(sum(rng.choice(differences) for _ in differences) / len(differences) for _ in range(10_000))
    return mean(differences), means[49], means[9_949]


def agree(args):
    runs = [args.run, *args.references]
    if len(args.references) < 2 or len(args.references) > len(T_99):
        sys.exit(f"agree needs 2 to {len(T_99)} reference runs, got {len(args.references)}")
    firsts, finals = zip(*((found[0]["task_means"], found[-1]["task_means"]) for found in map(evaluations, runs)))
    if len({len(final) for final in finals}) != 1 or not finals[0]:
        sys.exit(f"the runs evaluated different test splits ({[len(final) for final in finals]} tasks)")
    for run, first, final in zip(runs, firsts, finals):
        print(f"  {Path(run).name}: final test mean {mean(final):.3f}, final - start {mean(final) - mean(first):+.3f}")
    difference, low, high = paired(finals[0], finals[1])
    print(f"paired against {Path(runs[1]).name}: {difference:+.3f}, 99% interval [{low:+.3f}, {high:+.3f}] "
          f"over {len(finals[0])} tasks")
    references = [mean(final) for final in finals[1:]]
    n = len(references)
    centre = mean(references)
    spread = (sum((value - centre) ** 2 for value in references) / (n - 1)) ** 0.5
    half = T_99[n - 2] * spread * (1 + 1 / n) ** 0.5
    value = mean(finals[0])
    print(f"final test mean {value:.3f}; {n} reference runs {centre:.3f} (sd {spread:.3f}), "
          f"99% prediction interval [{centre - half:.3f}, {centre + half:.3f}]")
    if not centre - half <= value <= centre + half:
        sys.exit("the run disagrees with the reference runs beyond what runs of one configuration vary by")


def search(args):
    rows = [json.loads(line) for line in (Path(args.run) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    iterations = [row for row in rows if row.get("kind") == "search_iteration"]
    sessions = [json.loads(path.read_text()) for path in sorted((Path(args.run) / "archive/sessions").glob("*.json"))]
    turns = [session["turns"] for session in sessions]
    candidates = sum(len(session["candidates"]) for session in sessions)
    replies = [m for session in sessions for m in session["messages"] if m.get("role") == "assistant"]
    calls = sum(len(m.get("tool_calls") or []) for m in replies)
    print(f"{len(iterations)} search iteration(s); {len(sessions)} agent session(s) of {turns} turns, "
          f"{len(replies)} replies with {calls} tool call(s), {candidates} candidate(s) written")
    if not iterations or len(sessions) != len(iterations):
        sys.exit(f"{args.run}: the search iterations did not all complete with an agent session")
    errors = [session["error"] for session in sessions if session.get("error")]
    if errors:
        sys.exit(f"{args.run}: agent sessions failed: {errors}")


def losses(args):
    rows = [json.loads(line) for line in (Path(args.run) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [row for row in rows if row.get("kind") == "weight_step" and row.get("updates", 0) > 0]
    missing = [row.get("step") for row in trained if not isinstance(row.get("loss"), (int, float))]
    print(f"{len(trained)} trained weight step(s), losses {[row.get('loss') for row in trained]}")
    if not trained or missing:
        sys.exit(f"{args.run}: no trained weight step, or steps {missing} without the trainer's loss")


def copy(args):
    from safetensors.torch import load_file, save_file

    source, target = Path(args.src), Path(args.dst)
    shutil.copytree(source, target, dirs_exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    if args.untie:
        tensors = load_file(source / "model.safetensors")
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
        save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
        config["tie_word_embeddings"] = False
    if args.positions:
        config["max_position_embeddings"] = args.positions
    (target / "config.json").write_text(json.dumps(config, indent=2))
    print(f"copy of {source} in {target}")


def qwen35(args):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    source, target = Path(args.tokenizer_dir), Path(args.dst)
    base = json.loads((source / "config.json").read_text())
    config = Qwen3_5TextConfig(
        vocab_size=base["vocab_size"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        # vLLM's CPU kernel of the gated delta rule refuses head dims such as 32 ("Unexpected head
        # dim size"); 128 is Qwen3.5's own.
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=base["eos_token_id"],
        bos_token_id=base.get("bos_token_id"),
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).to(torch.float32)
    model.save_pretrained(target)
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    print(f"tiny Qwen3.5 ({sum(p.numel() for p in model.parameters())} parameters) in {target}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("parity")
    p.add_argument("url_a")
    p.add_argument("url_b")
    p.add_argument("model")
    p.add_argument("--tasks", required=True)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--differs-from", help="a model whose completions (at URL_B) must differ on some prompt")
    p.add_argument("--differs-from-url", help="the server of --differs-from (default URL_B)")
    p.set_defaults(handler=parity)
    p = commands.add_parser("sft-data")
    p.add_argument("tasks")
    p.add_argument("out")
    p.add_argument("--n", type=int, default=64)
    p.set_defaults(handler=sft_data)
    p = commands.add_parser("adapters")
    p.add_argument("url")
    p.add_argument("prefix")
    p.add_argument("expected")
    p.set_defaults(handler=adapters)
    p = commands.add_parser("agree")
    p.add_argument("run")
    p.add_argument("references", nargs="+")
    p.set_defaults(handler=agree)
    p = commands.add_parser("search")
    p.add_argument("run")
    p.set_defaults(handler=search)
    p = commands.add_parser("losses")
    p.add_argument("run")
    p.set_defaults(handler=losses)
    p = commands.add_parser("copy")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--untie", action="store_true")
    p.add_argument("--positions", type=int)
    p.set_defaults(handler=copy)
    p = commands.add_parser("qwen35")
    p.add_argument("tokenizer_dir")
    p.add_argument("dst")
    p.set_defaults(handler=qwen35)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
