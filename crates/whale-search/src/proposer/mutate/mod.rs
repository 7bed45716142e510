//! The offline proposer: real source-level edits of the incumbent, one mechanism per
//! candidate, each with a written hypothesis, and no network.
//!
//! Two kinds of edit, each anchored on something every harness has or degrading to "does not
//! apply" when it is missing:
//! - in place, on the prompt text (`instructions`): a phrase-bank sentence added, a sentence
//!   replaced or dropped in a string literal that reads as an instruction;
//! - around the harness (`layers`): the exported `solve` is wrapped in a middleware that
//!   adds a tool step, samples several replies and votes, retries invalid output, reformats
//!   the context, inserts few-shot examples or changes how answers are parsed; earlier layers
//!   can be removed again (an ablation, e.g. dropping a tool step);
//! - on what a prompt shows (`views`): a tool result's field swapped for a sibling holding the
//!   same items in another form (legal moves in SAN instead of UCI);
//! - on what a search looks for (`query`, a layer): the model writes the query of a search the
//!   harness makes, and may search once more from what it found;
//! - on how much a tool returns (`arguments`): an integer passed to a tool (a search's count
//!   of results) moved a step up or down.
//!
//! The proposer is deterministic for (seed, iteration, incumbent, examples), and every
//! candidate it returns has passed `whale_harness::validate`.

mod arguments;
mod instructions;
mod layers;
mod mechanisms;
mod phrases;
pub(crate) mod tokens;
mod views;

use super::{Proposal, ProposalContext, Proposer, ProposerError};
use layers::{Layer, LayerKind};
use mechanisms::{Formatting, Parsing, Shot};
use phrases::{Failure, Phrase, PHRASES};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use whale_core::Trajectory;
use whale_harness::{content_hash, validate, Limits};

/// Passes over the mutation kinds before a proposer settles for fewer than M candidates.
const ROUNDS: usize = 3;
/// Few-shot examples per candidate, and the characters one example may have.
const SHOTS: usize = 2;
const SHOT_CHARS: usize = 2_000;
/// Characters of a tool result shown to the model.
const TOOL_RESULT_CHARS: usize = 1_500;

/// One kind of source edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mutation {
    /// Add a phrase-bank instruction to a prompt literal (or to the system message).
    AddPhrase,
    /// Replace one sentence of a prompt literal with a phrase-bank instruction.
    RewriteSentence,
    /// Drop one sentence of a prompt literal.
    DropSentence,
    /// Consult a tool before model calls and show its result.
    ToolStep,
    /// Remove one earlier mechanism (a tool step or any other layer).
    DropLayer,
    /// k samples per model call and a majority vote on the final answer.
    Vote,
    /// Ask again after a cut-off or empty reply or a refused answer.
    Retry,
    /// Change how the messages are formatted.
    Format,
    /// Few-shot examples from accepted training trajectories.
    FewShot,
    /// Change how the answer is parsed.
    Parse,
    /// Show another form of a tool result's items in a prompt.
    ViewSwap,
    /// The model writes the query of each search (and may search a second time).
    Query,
    /// An integer argument of a tool call a step up or down.
    ToolArgument,
}

impl Mutation {
    /// The edits of the prompt text alone: what fast-slow's fast half may do.
    pub const PROMPT_TEXT: [Mutation; 3] = [Mutation::AddPhrase, Mutation::RewriteSentence, Mutation::DropSentence];

    /// The edits drawn only where what they edit exists, each after the others are shuffled.
    const WHERE_THEY_APPLY: [Mutation; 3] = [Mutation::ViewSwap, Mutation::Query, Mutation::ToolArgument];

    pub const ALL: [Mutation; 13] = [
        Mutation::AddPhrase,
        Mutation::RewriteSentence,
        Mutation::DropSentence,
        Mutation::ToolStep,
        Mutation::DropLayer,
        Mutation::Vote,
        Mutation::Retry,
        Mutation::Format,
        Mutation::FewShot,
        Mutation::Parse,
        Mutation::ViewSwap,
        Mutation::Query,
        Mutation::ToolArgument,
    ];
}

/// The mutation proposer.
#[derive(Debug, Clone)]
pub struct MutateProposer {
    mutations: Vec<Mutation>,
}

impl Default for MutateProposer {
    fn default() -> Self {
        Self { mutations: Mutation::ALL.to_vec() }
    }
}

impl MutateProposer {
    /// A proposer drawing only from `mutations`.
    pub fn with_mutations(mutations: Vec<Mutation>) -> Self {
        Self { mutations }
    }

    /// The candidate `mutation` makes of the incumbent with `seed`, if it applies and the
    /// result validates; an error when the incumbent holds a layer marker of an unknown kind.
    pub fn mutate(mutation: Mutation, ctx: &ProposalContext<'_>, seed: u64) -> Result<Option<Proposal>, ProposerError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let source = &ctx.incumbent.source;
        let found = layers::layers(source).map_err(|e| ProposerError::Incumbent(e.to_string()))?;
        let edit = match mutation {
            Mutation::AddPhrase => add_phrase(source, &found, ctx, &mut rng),
            Mutation::RewriteSentence => rewrite_sentence(source, ctx, &mut rng),
            Mutation::DropSentence => drop_sentence(source, &mut rng),
            Mutation::ToolStep => tool_step(source, &found, ctx, &mut rng),
            Mutation::DropLayer => drop_layer(source, &found, &mut rng),
            Mutation::Vote => vote(source, &found, ctx, &mut rng),
            Mutation::Retry => retry(source, &found, ctx.limits),
            Mutation::Format => format(source, &found, ctx.limits, &mut rng),
            Mutation::FewShot => few_shot(source, &found, ctx, &mut rng),
            Mutation::Parse => parse(source, &found, ctx.limits, &mut rng),
            Mutation::ViewSwap => views::swap(source, &views::forms(&recorded(ctx)), &mut rng),
            Mutation::Query => query(source, &found, ctx, &mut rng),
            Mutation::ToolArgument => arguments::step(source, &mut rng),
        };
        Ok(edit.filter(|(edited, _)| validate(edited, ctx.limits).is_ok()).map(|(edited, hypothesis)| Proposal {
            source: edited,
            hypothesis,
            parent: Some(ctx.incumbent.meta.id.clone()),
        }))
    }
}

impl Proposer for MutateProposer {
    fn name(&self) -> &str {
        "mutate"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed ^ ctx.iteration.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut order = self.mutations.clone();
        if ctx.prompt_only {
            order.retain(|m| Mutation::PROMPT_TEXT.contains(m));
        }
        let conditional: Vec<Mutation> = Mutation::WHERE_THEY_APPLY.into_iter().filter(|m| order.contains(m)).collect();
        order.retain(|m| !Mutation::WHERE_THEY_APPLY.contains(m));
        order.shuffle(&mut rng);
        // Each drawn only where it applies, so that in a domain without what it edits every
        // other draw, and every proposal, is what it was before the mutation existed.
        for mutation in conditional {
            if applies(mutation, ctx) {
                let at = rng.gen_range(0..=order.len());
                order.insert(at, mutation);
            }
        }
        let mut seen: HashSet<String> = HashSet::from([ctx.incumbent.meta.hash.clone()]);
        let mut proposals = Vec::new();
        for _ in 0..ROUNDS {
            for &mutation in &order {
                if proposals.len() >= ctx.candidates {
                    return Ok(proposals);
                }
                let seed = rng.gen();
                if let Some(proposal) = Self::mutate(mutation, ctx, seed)? {
                    if seen.insert(content_hash(&proposal.source)) {
                        proposals.push(proposal);
                    }
                }
            }
        }
        Ok(proposals)
    }
}

type Edit = Option<(String, String)>;

/// The trajectories a proposal may read tool results from: training examples and the
/// incumbent's failed search rollouts.
fn recorded<'a>(ctx: &ProposalContext<'a>) -> Vec<&'a Trajectory> {
    ctx.examples.iter().chain(ctx.failures).collect()
}

/// Whether what `mutation` edits exists: a tool result in several forms, a search, an integer
/// passed to a tool (every other mutation finds out by trying).
fn applies(mutation: Mutation, ctx: &ProposalContext<'_>) -> bool {
    match mutation {
        Mutation::ViewSwap => !views::forms(&recorded(ctx)).is_empty(),
        Mutation::Query => !searches(&recorded(ctx)).is_empty(),
        Mutation::ToolArgument => !arguments::arguments(&ctx.incumbent.source).is_empty(),
        _ => true,
    }
}

/// The tools the recorded rollouts searched with: called on a string (the query) and
/// answering with a list.
fn searches(trajectories: &[&Trajectory]) -> BTreeSet<String> {
    trajectories
        .iter()
        .flat_map(|t| &t.tool_calls)
        .filter(|c| c.error.is_none() && c.result.is_array())
        .filter(|c| c.args.as_array().and_then(|args| args.first()).is_some_and(|query| query.is_string()))
        .map(|c| c.name.clone())
        .collect()
}

fn excerpt(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

fn phrase_outside(text: &str, rng: &mut ChaCha8Rng) -> Option<Phrase> {
    let fresh: Vec<Phrase> = PHRASES.into_iter().filter(|p| !text.contains(p.text)).collect();
    fresh.choose(rng).copied()
}

/// The reflection step of a prompt-only proposal: the incumbent's failed search rollouts by
/// kind, the most common kind, and a sentence saying so. `None` when there is nothing to
/// reflect on (or the proposal may change more than the prompt).
fn reflection(ctx: &ProposalContext<'_>) -> Option<(Failure, String)> {
    if !ctx.prompt_only || ctx.failures.is_empty() {
        return None;
    }
    let mut counts: Vec<(Failure, usize)> = Vec::new();
    for failure in ctx.failures.iter().map(Failure::of) {
        match counts.iter_mut().find(|(kind, _)| *kind == failure) {
            Some((_, n)) => *n += 1,
            None => counts.push((failure, 1)),
        }
    }
    counts.sort_by_key(|&(kind, n)| (std::cmp::Reverse(n), kind));
    let tally: Vec<String> = counts.iter().map(|(kind, n)| format!("{n} {}", kind.describe())).collect();
    let summary = format!(
        "Reflection on the incumbent's {} failed search rollouts ({}): the instruction targets the most common failure. ",
        ctx.failures.len(),
        tally.join(", ")
    );
    Some((counts[0].0, summary))
}

/// A phrase not yet in `text`: with a reflection, one that answers its failure when there is
/// one; otherwise any.
fn phrase_for(text: &str, reflection: Option<Failure>, rng: &mut ChaCha8Rng) -> Option<Phrase> {
    let Some(failure) = reflection else { return phrase_outside(text, rng) };
    let fresh: Vec<Phrase> = PHRASES.into_iter().filter(|p| !text.contains(p.text)).collect();
    let answering: Vec<Phrase> = fresh.iter().copied().filter(|p| p.remedy == failure).collect();
    if answering.is_empty() { fresh.choose(rng) } else { answering.choose(rng) }.copied()
}

const REFUTED: &str = "Refuted if the success rate does not rise, or cost rises without a success gain.";

fn add_phrase(source: &str, found: &[Layer], ctx: &ProposalContext<'_>, rng: &mut ChaCha8Rng) -> Edit {
    let reflection = reflection(ctx);
    let literals: Vec<_> =
        instructions::instructions(source).into_iter().filter(|l| l.accepts_append(source)).collect();
    let Some(literal) = literals.choose(rng) else {
        if ctx.prompt_only {
            return None;
        }
        let phrase = phrase_outside(source, rng)?;
        let hypothesis = format!(
            "Prompt rewrite: add the instruction \"{}\" to the system message of every model call (the harness \
             has no prompt literal to edit), because {}. {REFUTED}",
            phrase.text, phrase.why
        );
        let body = mechanisms::instruction(phrase.text);
        let edited = layers::add_layer(source, found, LayerKind::Instruction, &hypothesis, &body, ctx.limits)?;
        return Some((edited, hypothesis));
    };
    let phrase = phrase_for(literal.text(source), reflection.as_ref().map(|r| r.0), rng)?;
    let hypothesis = format!(
        "{}Prompt rewrite: add \"{}\" to the instruction \"{}\", because {}. {REFUTED}",
        reflection.map(|r| r.1).unwrap_or_default(),
        phrase.text,
        excerpt(literal.text(source)),
        phrase.why
    );
    Some((literal.append(source, phrase.text), hypothesis))
}

fn rewrite_sentence(source: &str, ctx: &ProposalContext<'_>, rng: &mut ChaCha8Rng) -> Edit {
    let reflection = reflection(ctx);
    let literals: Vec<_> =
        instructions::instructions(source).into_iter().filter(|l| !l.sentences(source).is_empty()).collect();
    let literal = literals.choose(rng)?;
    let sentences = literal.sentences(source);
    let index = rng.gen_range(0..sentences.len());
    let old = &source[sentences[index].clone()];
    let phrase = phrase_for(literal.text(source), reflection.as_ref().map(|r| r.0), rng)?;
    let hypothesis = format!(
        "{}Prompt rewrite: replace \"{}\" with \"{}\", because {}. {REFUTED}",
        reflection.map(|r| r.1).unwrap_or_default(),
        excerpt(old),
        phrase.text,
        phrase.why
    );
    Some((literal.replace_sentence(source, index, phrase.text)?, hypothesis))
}

fn drop_sentence(source: &str, rng: &mut ChaCha8Rng) -> Edit {
    let literals: Vec<_> =
        instructions::instructions(source).into_iter().filter(|l| l.sentences(source).len() >= 2).collect();
    let literal = literals.choose(rng)?;
    let sentences = literal.sentences(source);
    let index = rng.gen_range(0..sentences.len());
    let hypothesis = format!(
        "Prompt rewrite: drop the sentence \"{}\" from the instruction. A shorter prompt costs fewer tokens and \
         leaves fewer instructions to follow; if the sentence was not helping, success holds while cost falls. \
         Refuted if the success rate falls.",
        excerpt(&source[sentences[index].clone()])
    );
    Some((literal.drop_sentence(source, index)?, hypothesis))
}

fn has_layer(found: &[Layer], kind: LayerKind) -> bool {
    found.iter().any(|l| l.kind == kind)
}

fn tool_step(source: &str, found: &[Layer], ctx: &ProposalContext<'_>, rng: &mut ChaCha8Rng) -> Edit {
    if ctx.limits.tool_calls == 0 {
        return None;
    }
    let pick = rng.gen_range(0..8);
    let lookups = (ctx.limits.tool_calls / 2).clamp(1, 8);
    let hypothesis = format!(
        "Tool step: before model calls, consult one of the task's tools (the {pick}th, modulo their number, of \
         those callable without task knowledge: a state reading, a search on the observation, or a calculator on an \
         expression the model writes first) and append its result to the prompt, so the model reasons from fresh \
         facts instead of recall. {REFUTED}"
    );
    let body = mechanisms::tool_step(pick, lookups, TOOL_RESULT_CHARS);
    Some((layers::add_layer(source, found, LayerKind::ToolStep, &hypothesis, &body, ctx.limits)?, hypothesis))
}

/// Searches of a rollout whose query the model writes.
const REWRITTEN_SEARCHES: usize = 2;

fn query(source: &str, found: &[Layer], ctx: &ProposalContext<'_>, rng: &mut ChaCha8Rng) -> Edit {
    let tools = searches(&recorded(ctx));
    let hops = *[1usize, 2].choose(rng)?;
    if tools.is_empty() || has_layer(found, LayerKind::Query) || ctx.limits.model_calls < 2 * hops + 1 {
        return None;
    }
    let tools = tools.into_iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ");
    let second =
        if hops == 2 { ", then, shown what that search found, may search once more (a second hop)" } else { "" };
    let hypothesis = format!(
        "Query rewrite: the model writes the query of the rollout's first {REWRITTEN_SEARCHES} searches ({tools}) \
         in the search protocol (`SEARCH: <query>`){second}, instead of the harness searching the question's own \
         words, which dilute a keyword ranking; its results come first, then the harness's own. Costs {hops} model \
         call(s) and search(es) per search; refuted if the success rate does not rise."
    );
    let body = mechanisms::query(hops, REWRITTEN_SEARCHES);
    Some((layers::add_layer(source, found, LayerKind::Query, &hypothesis, &body, ctx.limits)?, hypothesis))
}

fn drop_layer(source: &str, found: &[Layer], rng: &mut ChaCha8Rng) -> Edit {
    let layer = found.choose(rng)?;
    let hypothesis = if layer.kind == LayerKind::ToolStep {
        format!(
            "Remove the tool step `{}`: if its results were not helping the model, success holds while tool \
             calls and prompt tokens fall. Refuted if the success rate falls.",
            layer.name()
        )
    } else {
        format!(
            "Ablation: remove the `{}` mechanism ({}). If it was not helping, success holds while cost falls. \
             Refuted if the success rate falls.",
            layer.name(),
            excerpt(&layer.hypothesis)
        )
    };
    Some((layers::remove_layer(source, layer), hypothesis))
}

fn vote(source: &str, found: &[Layer], ctx: &ProposalContext<'_>, rng: &mut ChaCha8Rng) -> Edit {
    let samples = *[3usize, 5].choose(rng)?;
    if ctx.limits.model_calls < samples + 2 || has_layer(found, LayerKind::Vote) {
        return None;
    }
    let hypothesis = format!(
        "Self-consistency: sample {samples} replies to each model call and keep the one whose final answer is the \
         most common (one sample once the call or prompt budget runs low). At temperature 1 a majority answer \
         is right more often than a single sample. Costs about {samples}x the tokens; refuted if the success rate \
         does not rise."
    );
    let body = mechanisms::vote(samples);
    Some((layers::add_layer(source, found, LayerKind::Vote, &hypothesis, &body, ctx.limits)?, hypothesis))
}

fn retry(source: &str, found: &[Layer], limits: &Limits) -> Edit {
    if has_layer(found, LayerKind::Retry) {
        return None;
    }
    let hypothesis = "Retry on invalid output: a reply cut off at max_tokens or empty is asked for again once, and an \
                      answer or move the environment refuses as invalid is corrected by the model once using the \
                      refusal message, so a malformed output costs a retry instead of the task. Refuted if the \
                      success rate does not rise."
        .to_string();
    Some((layers::add_layer(source, found, LayerKind::Retry, &hypothesis, &mechanisms::retry(), limits)?, hypothesis))
}

fn format(source: &str, found: &[Layer], limits: &Limits, rng: &mut ChaCha8Rng) -> Edit {
    let fresh: Vec<Formatting> =
        Formatting::ALL.into_iter().filter(|&f| !has_layer(found, LayerKind::Format(f))).collect();
    let formatting = *fresh.choose(rng)?;
    let hypothesis = format!("Context formatting: {}. {REFUTED}", formatting.describe());
    let body = mechanisms::format_messages(formatting);
    Some((layers::add_layer(source, found, LayerKind::Format(formatting), &hypothesis, &body, limits)?, hypothesis))
}

fn parse(source: &str, found: &[Layer], limits: &Limits, rng: &mut ChaCha8Rng) -> Edit {
    let fresh: Vec<Parsing> = Parsing::ALL.into_iter().filter(|&p| !has_layer(found, LayerKind::Parse(p))).collect();
    let parsing = *fresh.choose(rng)?;
    let hypothesis = format!("Answer parsing: {}. {REFUTED}", parsing.describe());
    let body = mechanisms::parse(parsing);
    Some((layers::add_layer(source, found, LayerKind::Parse(parsing), &hypothesis, &body, limits)?, hypothesis))
}

fn few_shot(source: &str, found: &[Layer], ctx: &ProposalContext<'_>, rng: &mut ChaCha8Rng) -> Edit {
    if has_layer(found, LayerKind::FewShot) {
        return None;
    }
    let mut shots = shots(ctx);
    shots.shuffle(rng);
    shots.truncate(SHOTS);
    if shots.is_empty() {
        return None;
    }
    let hypothesis = format!(
        "Few-shot: show {} solved training example(s) as prior user/assistant turns before each model call; a \
         demonstration of the expected reasoning and answer format helps a small model more than instructions \
         do. Costs prompt tokens; refuted if the success rate does not rise.",
        shots.len()
    );
    let body = mechanisms::few_shot(&shots);
    Some((layers::add_layer(source, found, LayerKind::FewShot, &hypothesis, &body, ctx.limits)?, hypothesis))
}

/// One example per successful trajectory (its first trainable call: the last user message and
/// the completion), one per task, short ones only.
fn shots(ctx: &ProposalContext<'_>) -> Vec<Shot> {
    let mut tasks = HashSet::new();
    ctx.examples
        .iter()
        .filter(|t| t.success && t.error.is_none())
        .filter_map(|t| {
            let call = t.model_calls.iter().find(|c| c.trainable)?;
            let user = call.messages.iter().rev().find(|m| m.role == "user")?;
            let shot = Shot { user: user.content.trim().to_string(), assistant: call.completion.trim().to_string() };
            let fits = !shot.user.is_empty() && !shot.assistant.is_empty();
            (fits && shot.user.len() + shot.assistant.len() <= SHOT_CHARS && tasks.insert(t.task_id.clone()))
                .then_some(shot)
        })
        .collect()
}
