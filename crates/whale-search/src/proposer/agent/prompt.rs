//! What the agentic proposer is told at the start of a session. The full prompt gives a model
//! with a long context the whole harness API and leaves the archive to its tools. The compact
//! prompt is for a small model served on a CPU, where each prompt token costs prefill time and
//! memory and each tool turn a round trip: the API in brief, and inline what the model would
//! otherwise spend its first turns reading (the incumbent's source, its score and a few of its
//! failed rollouts, each cut short).

use super::super::{ProposalContext, ProposerError};
use crate::archive::read_scores;
use crate::guide::{HARNESS_API, SEARCH_RULES};
use whale_core::Trajectory;
use whale_harness::Limits;

/// Failed rollouts the compact prompt shows, and the characters of each part of one.
const FAILURES_SHOWN: usize = 2;
const PROMPT_TAIL_CHARS: usize = 600;
const REPLY_HEAD_CHARS: usize = 500;
const REPLY_TAIL_CHARS: usize = 300;
const DETAIL_CHARS: usize = 300;

/// The system and task prompts of a session; an archive whose incumbent's scores cannot be
/// read is an infrastructure error that stops the search, not a prompt without them.
pub(super) fn prompts(ctx: &ProposalContext<'_>, compact: bool) -> Result<(String, String), ProposerError> {
    Ok(if compact {
        (compact_system_prompt(ctx.limits), compact_task_prompt(ctx)?)
    } else {
        (system_prompt(), task_prompt(ctx))
    })
}

fn system_prompt() -> String {
    format!(
        "You improve a harness: the JavaScript program that wraps a language model to solve tasks. You work \
         in an archive of every harness tried so far, with their scores and raw rollout traces, through tools: \
         list_dir, read_file and grep to study it, check_candidate to validate a source, write_candidate to \
         submit a candidate. Study the incumbent and its failed traces first, then write candidates, each a \
         complete harness source with one new mechanism and a hypothesis.\n\n{SEARCH_RULES}\n\
         The harness API follows.\n\n{HARNESS_API}"
    )
}

fn compact_system_prompt(limits: &Limits) -> String {
    format!(
        "You improve a harness: the JavaScript program that wraps a language model to solve tasks. The task \
         message shows the current best harness and some of its failures. Write candidates with the \
         write_candidate tool, each a complete harness source with one new mechanism and a hypothesis; \
         check_candidate validates a source first, and read_file, grep and list_dir show more of the archive.\n\n\
         {SEARCH_RULES}\n{}",
        harness_brief(limits)
    )
}

/// The harness API in the fewest words that let a model write a valid harness; harness-api.md
/// in the archive has the rest.
fn harness_brief(limits: &Limits) -> String {
    format!(
        "The harness API in brief (harness-api.md in the archive has all of it):\n\
         - One JavaScript ES module, run by QuickJS: no imports, files, network or timers. It exports \
         `async function solve(task, ctx)`, called once per rollout.\n\
         - `ctx.env.observation` is the text to show the model (the question, or the position).\n\
         - `ctx.llm.chat(messages, opts)` calls the model; `messages` is a string or an array of \
         {{role, content}} (roles system, user, assistant); `opts` may set max_tokens, temperature, top_p, \
         top_k, stop and trainable. It returns {{text, finish_reason, prompt_tokens, completion_tokens}}.\n\
         - `ctx.tools.<name>(...)` calls a tool of the task's domain: math calculator(expression) (exact \
         arithmetic); qa search(query, k) returning [{{title, text}}]; chess legal_moves(), fen(), board(), \
         side_to_move(), last_move().\n\
         - Math and QA: return the answer (a string or a number). Chess: call ctx.env.play(move) with a UCI \
         move (e2e4) while !ctx.env.done.\n\
         - Per rollout: at most {} model calls, {} tool calls, {} characters of prompt over all calls and {} ms \
         of the harness's own computing. A broken limit or an uncaught exception scores 0.\n",
        limits.model_calls, limits.tool_calls, limits.prompt_chars, limits.compute_ms
    )
}

fn task_prompt(ctx: &ProposalContext<'_>) -> String {
    let incumbent = &ctx.incumbent.meta;
    let task = format!(
        "Iteration {iteration}, domain {domain}. The incumbent is candidates/{id}/harness.js (hash {hash}); its \
         scores and traces under the current weights are in results/{hash}/w{version}/. summary.jsonl logs every \
         earlier candidate, frontier.json the Pareto front. Write {m} candidate(s) with write_candidate, then stop.",
        iteration = ctx.iteration,
        domain = ctx.domain,
        id = incumbent.id,
        hash = incumbent.hash,
        version = ctx.weights_version,
        m = ctx.candidates,
    );
    with_prompt_only_rule(ctx, task)
}

fn compact_task_prompt(ctx: &ProposalContext<'_>) -> Result<String, ProposerError> {
    let task = format!(
        "{}\n\nWrite {} candidate(s) with write_candidate, each a complete source with one new mechanism and its \
         hypothesis, then stop.",
        incumbent_inline(ctx, 0)?,
        ctx.candidates
    );
    Ok(with_prompt_only_rule(ctx, task))
}

/// The system and task prompts of the one-shot proposer's request for candidate `index`: no
/// tools, the incumbent inline, and a reply of one hypothesis line and one code block. Each
/// request of an iteration shows the next failed rollouts, so that the candidates differ.
pub(super) fn one_shot_prompts(ctx: &ProposalContext<'_>, index: usize) -> Result<(String, String), ProposerError> {
    let system = format!(
        "You improve a harness: the JavaScript program that wraps a language model to solve tasks. The task \
         message shows the current best harness and some of its failures. Write one new harness that adds one \
         new mechanism to it. Reply in exactly this form and nothing else:\n\n\
         Hypothesis: <what you changed, why it should help, what result would refute it>\n\
         ```js\n<the complete new harness source>\n```\n\n{SEARCH_RULES}\n{}",
        harness_brief(ctx.limits)
    );
    let task = format!(
        "{}\n\nReply with one line starting `Hypothesis:` and then the complete new harness in one ```js code block.",
        incumbent_inline(ctx, index * FAILURES_SHOWN)?
    );
    Ok((system, with_prompt_only_rule(ctx, task)))
}

/// The incumbent's source and score, and [`FAILURES_SHOWN`] of its failed rollouts from the
/// `first`-th on (counting round the list).
fn incumbent_inline(ctx: &ProposalContext<'_>, first: usize) -> Result<String, ProposerError> {
    let incumbent = &ctx.incumbent.meta;
    let card = read_scores(ctx.archive, &incumbent.hash, ctx.weights_version).map_err(|e| ProposerError::Io {
        context: "the incumbent's scores".into(),
        source: std::io::Error::other(e),
    })?;
    let score = card.map_or(String::new(), |card| {
        format!(
            " It solved {:.0}% of the {} search tasks under the current weights.",
            100.0 * card.objectives.success,
            card.tasks.len()
        )
    });
    let count = ctx.failures.len();
    let shown: Vec<String> =
        (0..FAILURES_SHOWN.min(count)).map(|offset| failure_digest(&ctx.failures[(first + offset) % count])).collect();
    let failures = if shown.is_empty() {
        String::new()
    } else {
        format!(
            "\n\n{} of its {} failed rollouts on the search tasks (all of them are in results/{}/w{}/traces.jsonl):\n\n{}",
            shown.len(),
            count,
            incumbent.hash,
            ctx.weights_version,
            shown.join("\n\n")
        )
    };
    Ok(format!(
        "Iteration {iteration}, domain {domain}. The incumbent harness is candidates/{id}/harness.js.{score}\n\n\
         ```js\n{source}\n```{failures}",
        iteration = ctx.iteration,
        domain = ctx.domain,
        id = incumbent.id,
        source = ctx.incumbent.source.trim_end(),
    ))
}

fn with_prompt_only_rule(ctx: &ProposalContext<'_>, task: String) -> String {
    if !ctx.prompt_only {
        return task;
    }
    format!(
        "{task}\nThis search edits prompt text only: read the incumbent's failed traces, then change only the text \
         inside its string and template literals (instructions, wording, examples written into the prompt). Any \
         change to code, control flow, tool use or parsing, even a ${{}} substitution, is rejected unscored."
    )
}

/// One failed rollout in a few lines: what went wrong, the end of its last prompt, the start
/// and end of the model's last reply, and the answer it gave.
fn failure_digest(trajectory: &Trajectory) -> String {
    let outcome = match &trajectory.error {
        Some(error) => {
            let kind = serde_json::to_value(error.kind).ok().and_then(|v| v.as_str().map(String::from));
            format!("error {}: {}", kind.unwrap_or_default(), error.message)
        }
        None if !trajectory.verdict_detail.is_empty() => trajectory.verdict_detail.clone(),
        None => format!("reward {}", trajectory.reward),
    };
    let mut lines = vec![format!("task {}: {}", trajectory.task_id, head(&outcome, DETAIL_CHARS))];
    if let Some(call) = trajectory.model_calls.last() {
        let prompt = call.messages.last().map(|m| m.content.as_str()).unwrap_or_default();
        lines.push(format!("last prompt: {}", tail(prompt, PROMPT_TAIL_CHARS)));
        lines.push(format!("its reply: {}", head_and_tail(&call.completion, REPLY_HEAD_CHARS, REPLY_TAIL_CHARS)));
    }
    let answer = trajectory.answer.as_ref().map_or("none".to_string(), ToString::to_string);
    lines.push(format!("answer: {}", head(&answer, DETAIL_CHARS)));
    lines.join("\n")
}

fn head(text: &str, chars: usize) -> String {
    let count = text.chars().count();
    if count <= chars {
        return text.to_string();
    }
    format!("{}[... {} more characters]", text.chars().take(chars).collect::<String>(), count - chars)
}

fn tail(text: &str, chars: usize) -> String {
    let count = text.chars().count();
    if count <= chars {
        return text.to_string();
    }
    format!("[{} characters before ...]{}", count - chars, text.chars().skip(count - chars).collect::<String>())
}

fn head_and_tail(text: &str, head_chars: usize, tail_chars: usize) -> String {
    let count = text.chars().count();
    if count <= head_chars + tail_chars {
        return text.to_string();
    }
    let start: String = text.chars().take(head_chars).collect();
    let end: String = text.chars().skip(count - tail_chars).collect();
    format!("{start}[... {} characters ...]{end}", count - head_chars - tail_chars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::{Candidate, CandidateMeta};
    use whale_core::Domain;

    #[test]
    fn unreadable_scores_of_the_incumbent_stop_the_session_as_an_infrastructure_fault() {
        let dir = tempfile::tempdir().expect("tempdir");
        let scores = dir.path().join("results/h/w0");
        std::fs::create_dir_all(&scores).expect("results");
        std::fs::write(scores.join("scores.json"), "{not json").expect("a corrupt file");
        let meta = CandidateMeta {
            id: "c0000".into(),
            parent: None,
            hypothesis: String::new(),
            hash: "h".into(),
            iteration: 0,
            proposer: "seed".into(),
            rejection: None,
        };
        let incumbent = Candidate { meta, source: "export function solve() {}".into() };
        let limits = Limits::default();
        let ctx = ProposalContext {
            archive: dir.path(),
            incumbent: &incumbent,
            domain: Domain::Math,
            candidates: 1,
            iteration: 1,
            weights_version: 0,
            seed: 0,
            examples: &[],
            limits: &limits,
            prompt_only: false,
            failures: &[],
        };
        let error = prompts(&ctx, true).expect_err("a corrupt scores file");
        assert!(error.is_infrastructure() && error.to_string().contains("scores.json"), "{error}");
        assert!(prompts(&ctx, false).is_ok(), "the full prompt leaves the scores to the tools");
    }

    #[test]
    fn long_texts_are_cut_to_their_ends_and_say_how_much_is_left_out() {
        let text: String = ('a'..='z').collect();
        assert_eq!(head(&text, 3), "abc[... 23 more characters]");
        assert_eq!(tail(&text, 3), "[23 characters before ...]xyz");
        assert_eq!(head_and_tail(&text, 2, 2), "ab[... 22 characters ...]yz");
        assert_eq!(head_and_tail("short", 2, 3), "short");
        assert_eq!(head("é".repeat(4).as_str(), 2), "éé[... 2 more characters]", "characters, not bytes");
    }
}
