//! What a proposer is told: the archive's layout and the rules of good harness search. The
//! same text is the archive's `README.md` (for command-line agents that read files) and part
//! of the agentic proposer's system prompt, so every proposer works from one set of rules.

/// The rules every proposer follows; they keep the search a search over mechanisms rather
/// than a fit to the search tasks.
pub const SEARCH_RULES: &str = "\
Rules of good harness search:
1. One mechanism per candidate. Change one idea (a prompt instruction, a tool step, sampling
   several replies and voting, retrying an invalid answer, how the context is formatted,
   few-shot examples, how the answer is parsed) so that its score tells you whether the idea works.
2. Write a hypothesis for every candidate: what you changed, why it should raise the success
   rate or lower the cost, and what result would refute it.
3. No constant-only tuning. Changing a number (a max_tokens, a retry count, a temperature)
   without a new mechanism is not a candidate.
4. Nothing specific to a dataset's items. Never copy a search task's question, answer or
   position into a harness; never branch on a task id. A harness must work on unseen tasks.
5. Read before writing: look at the incumbent's source, its scores, and the traces of its
   failed rollouts (results/<hash>/w<version>/traces.jsonl) to find what goes wrong.
6. Keep the harness valid: one self-contained ES module exporting `solve(task, ctx)`, within
   the limits of harness-api.md (model calls, tool calls, prompt characters).
";

/// `README.md` of an archive.
pub fn archive_readme() -> String {
    format!(
        "\
# Harness search archive

Every harness ever proposed in this search, with its scores and raw rollout traces. Results
are keyed by the harness's content hash and the weights version, never by the candidate's name.

- `candidates/<id>/harness.js` — the candidate's source.
- `candidates/<id>/meta.json` — id, parent, hypothesis, content hash, iteration, proposer and,
  for a candidate that was not scored, why it was rejected.
- `results/<hash>/w<version>/scores.json` — success rate, mean turns and tokens, per-task outcomes.
- `results/<hash>/w<version>/traces.jsonl` — one trajectory per search task (every model call,
  tool call, answer, reward and error).
- `summary.jsonl` — the append-only log: proposals, rejections, scores, accepted incumbents.
- `frontier.json` — the Pareto front (success up, turns and tokens down) under the current weights
  and the incumbent.
- `sessions/` — proposer sessions.
- `harness-api.md` — how to write a harness.

The archive holds search tasks only: no test task and no test result ever enters it.

{SEARCH_RULES}"
    )
}

/// The harness API reference, copied into every archive as `harness-api.md`.
pub const HARNESS_API: &str = include_str!("../../../docs/harness-api.md");
