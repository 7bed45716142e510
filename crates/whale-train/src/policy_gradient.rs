//! The policy-gradient update (GRPO, RLOO): a token-level clipped surrogate over sampled
//! completions, each carrying its advantage and the log-probabilities its sampling policy gave
//! its tokens.
//!
//! Rejection sampling learns only from the rollouts that passed; a policy gradient also pushes
//! down the tokens of the ones that failed. The per-token objective is PPO's
//!
//! ```text
//! ratio_t = exp(logp_t - behaviour_t)
//! loss_t  = -min(ratio_t A, clip(ratio_t, 1 - eps, 1 + eps) A) + kl_coef * k3_t
//! k3_t    = exp(reference_t - logp_t) - (reference_t - logp_t) - 1
//! ```
//!
//! averaged over the mini-batch's completion tokens ("token-mean", as verl and DAPO do). Every
//! log-probability is the model's at temperature 1 over the whole vocabulary: what the engine
//! records when it samples (whale-engine's `SampledToken::logprob`) and what [`completion_logprobs`]
//! computes, which a caller uses for `behaviour` so that the first update of a step has ratio
//! 1 (up to float rounding between micro-batch layouts, and a LoRA adapter's dropout, which
//! only the training pass applies). Where the clipped term is the smaller one its gradient is zero, so each token's
//! term is built from a mask decided on the forward pass's values.

use crate::trainer::{
    longest_first_micro_batches, micro_batch_ranges, scored_cross_entropy, SftBatch, SftExample, SftTrainer,
    TrainError, TrainerConfig,
};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use whale_lm::trainable::TrainableModel;

/// A sampled completion to learn from.
#[derive(Debug, Clone, PartialEq)]
pub struct PgExample {
    /// The prompt the policy saw (context, never trained on); at least one token.
    pub prompt: Vec<u32>,
    /// The sampled token ids.
    pub completion: Vec<u32>,
    /// The advantage of the rollout the completion belongs to, for every one of its tokens.
    pub advantage: f32,
    /// Per completion token, its log-probability under the sampling policy.
    pub behaviour: Vec<f32>,
    /// Per completion token, its log-probability under the reference (starting) weights;
    /// empty when there is no KL penalty.
    pub reference: Vec<f32>,
}

impl PgExample {
    /// Prompt and completion tokens together: what the example takes of a micro-batch.
    pub fn tokens(&self) -> usize {
        self.prompt.len() + self.completion.len()
    }
}

/// The clipped surrogate's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PgObjective {
    /// The ratio is clipped to `[1 - clip_epsilon, 1 + clip_epsilon]`.
    pub clip_epsilon: f64,
    /// The weight of the k3 estimate of KL(policy || reference); 0 turns it off.
    pub kl_coef: f64,
}

/// Sums over the scored tokens of a pass, from the forward pass's values.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PgTokenStats {
    pub tokens: usize,
    /// Σ loss_t (surrogate plus the KL term).
    pub loss: f64,
    /// Tokens whose clipped term was the smaller one (no gradient).
    pub clipped: usize,
    /// Σ k3_t, when there is a reference.
    pub kl: f64,
    /// The largest |ratio_t - 1|.
    pub ratio_deviation: f64,
}

impl PgTokenStats {
    fn add(&mut self, other: &Self) {
        self.tokens += other.tokens;
        self.loss += other.loss;
        self.clipped += other.clipped;
        self.kl += other.kl;
        self.ratio_deviation = self.ratio_deviation.max(other.ratio_deviation);
    }
}

/// What one policy-gradient update did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PgStepStats {
    /// Per-token means over the mini-batch, before the update.
    pub loss: f64,
    pub clip_fraction: f64,
    /// Mean k3 per token; `None` without reference log-probabilities.
    pub kl: Option<f64>,
    pub ratio_deviation: f64,
    pub tokens: usize,
    pub examples: usize,
    pub truncated: usize,
    pub learning_rate: f64,
    pub grad_norm: f64,
}

/// A micro-batch: the padded layout of its examples and, per scored position (in
/// [`scored_cross_entropy`]'s order), the advantage and the recorded log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct PgBatch {
    pub batch: SftBatch,
    pub advantages: Vec<f32>,
    pub behaviour: Vec<f32>,
    /// Empty when the examples carry no reference log-probabilities.
    pub reference: Vec<f32>,
}

impl PgBatch {
    /// Lays out examples, each cut to `max_seq_len` tokens (the cut tokens are not scored);
    /// also returns how many were cut. Fails on an empty prompt or log-probabilities that do
    /// not match the completion.
    pub fn new(examples: &[&PgExample], pad_token_id: u32, max_seq_len: usize) -> Result<(Self, usize), TrainError> {
        let with_reference = examples.first().is_some_and(|e| !e.reference.is_empty());
        let (mut advantages, mut behaviour, mut reference) = (Vec::new(), Vec::new(), Vec::new());
        for (index, example) in examples.iter().enumerate() {
            check(index, example, with_reference)?;
            let scored = example.tokens().min(max_seq_len) - example.prompt.len().min(max_seq_len);
            advantages.extend(std::iter::repeat_n(example.advantage, scored));
            behaviour.extend_from_slice(&example.behaviour[..scored]);
            if with_reference {
                reference.extend_from_slice(&example.reference[..scored]);
            }
        }
        let plain: Vec<SftExample> = examples
            .iter()
            .map(|e| SftExample { prompt: e.prompt.clone(), completion: e.completion.clone() })
            .collect();
        let (batch, truncated) = SftBatch::from_examples(&plain, pad_token_id, max_seq_len);
        Ok((Self { batch, advantages, behaviour, reference }, truncated))
    }
}

fn check(index: usize, example: &PgExample, with_reference: bool) -> Result<(), TrainError> {
    let fault = |reason: String| Err(TrainError::Batch(format!("policy-gradient example {index}: {reason}")));
    let tokens = example.completion.len();
    if example.prompt.is_empty() {
        return fault("the prompt is empty".to_string());
    }
    if example.behaviour.len() != tokens {
        return fault(format!(
            "{} behaviour log-probabilities for {tokens} completion tokens",
            example.behaviour.len()
        ));
    }
    let expected = if with_reference { tokens } else { 0 };
    if example.reference.len() != expected {
        return fault(format!(
            "{} reference log-probabilities for {tokens} completion tokens (a batch's examples all have them, or none)",
            example.reference.len()
        ));
    }
    if !example.advantage.is_finite() {
        return fault(format!("advantage {} is not finite", example.advantage));
    }
    Ok(())
}

/// The log-probability (f32, differentiable) of each scored token of `batch` under `model`.
pub fn token_logprobs<M: TrainableModel>(model: &M, batch: &SftBatch) -> Result<Tensor, TrainError> {
    Ok(scored_cross_entropy(model, batch)?.neg()?)
}

/// The summed loss (f32 scalar, differentiable through `logprobs`) of one micro-batch, and its
/// statistics. `logprobs` are [`token_logprobs`] of `pg.batch`.
pub fn surrogate_loss(
    logprobs: &Tensor,
    pg: &PgBatch,
    objective: &PgObjective,
) -> Result<(Tensor, PgTokenStats), TrainError> {
    let values = logprobs.to_vec1::<f32>()?;
    if values.len() != pg.advantages.len() {
        return Err(TrainError::Batch(format!(
            "{} log-probabilities for {} scored tokens",
            values.len(),
            pg.advantages.len()
        )));
    }
    let (low, high) = (1.0 - objective.clip_epsilon, 1.0 + objective.clip_epsilon);
    let mut stats = PgTokenStats { tokens: values.len(), ..PgTokenStats::default() };
    let mut active = Vec::with_capacity(values.len());
    let mut constant = 0.0;
    for ((&logp, &old), &advantage) in values.iter().zip(&pg.behaviour).zip(&pg.advantages) {
        let (ratio, advantage) = ((f64::from(logp) - f64::from(old)).exp(), f64::from(advantage));
        let (unclipped, clipped) = (ratio * advantage, ratio.clamp(low, high) * advantage);
        stats.ratio_deviation = stats.ratio_deviation.max((ratio - 1.0).abs());
        stats.loss -= unclipped.min(clipped);
        if clipped < unclipped {
            stats.clipped += 1;
            constant -= clipped;
            active.push(0.0f32);
        } else {
            active.push(advantage as f32);
        }
    }
    let device = logprobs.device();
    let behaviour = Tensor::from_slice(&pg.behaviour, values.len(), device)?;
    let weights = Tensor::from_vec(active, values.len(), device)?;
    let ratio = (logprobs - behaviour)?.exp()?;
    let mut loss = (ratio * weights)?.sum_all()?.affine(-1.0, constant)?;
    if objective.kl_coef > 0.0 && !pg.reference.is_empty() {
        let (summed, kl) = k3(logprobs, &values, &pg.reference)?;
        stats.kl = kl;
        stats.loss += objective.kl_coef * kl;
        loss = (loss + (summed * objective.kl_coef)?)?;
    }
    Ok((loss, stats))
}

/// Σ k3 over the tokens, as a differentiable scalar and as its value.
fn k3(logprobs: &Tensor, values: &[f32], reference: &[f32]) -> Result<(Tensor, f64), TrainError> {
    let value = values
        .iter()
        .zip(reference)
        .map(|(&logp, &reference)| {
            let d = f64::from(reference) - f64::from(logp);
            d.exp() - d - 1.0
        })
        .sum();
    let d = (Tensor::from_slice(reference, values.len(), logprobs.device())? - logprobs)?;
    let summed = ((d.exp()? - &d)? - 1.0)?.sum_all()?;
    Ok((summed, value))
}

impl<M: TrainableModel> SftTrainer<M> {
    /// One policy-gradient update on a mini-batch: examples grouped by length into
    /// micro-batches (gradient accumulation), the loss the mean over all their completion
    /// tokens. Fails without touching the weights when there is nothing to train on or the
    /// gradient is not finite.
    pub fn policy_gradient_step(
        &mut self,
        examples: &[PgExample],
        objective: &PgObjective,
    ) -> Result<PgStepStats, TrainError> {
        let (batches, truncated) = self.pg_micro_batches(examples)?;
        let tokens: usize = batches.iter().map(|b| b.batch.tokens()).sum();
        if tokens == 0 {
            return Err(TrainError::NoTrainableTokens);
        }
        self.check_memory(batches.iter().map(|b| &b.batch).filter(|batch| batch.tokens() > 0))?;
        let mut sums = PgTokenStats::default();
        let scored = batches.iter().filter(|b| b.batch.tokens() > 0);
        let grads = self.gradients(scored, tokens, |model, pg| {
            let (summed, stats) = surrogate_loss(&token_logprobs(model, &pg.batch)?, pg, objective)?;
            sums.add(&stats);
            Ok(summed)
        })?;
        let loss = sums.loss / tokens as f64;
        let (learning_rate, grad_norm) = self.update(&grads, loss, tokens, examples.len())?;
        let with_reference = objective.kl_coef > 0.0 && batches.iter().any(|b| !b.reference.is_empty());
        Ok(PgStepStats {
            loss,
            clip_fraction: sums.clipped as f64 / tokens as f64,
            kl: with_reference.then(|| sums.kl / tokens as f64),
            ratio_deviation: sums.ratio_deviation,
            tokens,
            examples: examples.len(),
            truncated,
            learning_rate,
            grad_norm,
        })
    }
}

impl<M: TrainableModel> SftTrainer<M> {
    /// The mean per-token loss of `examples` under the current weights, no update.
    pub fn evaluate_policy_gradient(&self, examples: &[PgExample], objective: &PgObjective) -> Result<f64, TrainError> {
        let (batches, _) = self.pg_micro_batches(examples)?;
        let mut sums = PgTokenStats::default();
        for pg in batches.iter().filter(|b| b.batch.tokens() > 0) {
            let (_, stats) = surrogate_loss(&token_logprobs(self.model(), &pg.batch)?, pg, objective)?;
            sums.add(&stats);
        }
        if sums.tokens == 0 {
            return Err(TrainError::NoTrainableTokens);
        }
        Ok(sums.loss / sums.tokens as f64)
    }

    /// Micro-batches of similar lengths (longest first), and how many examples were cut.
    /// Every example is checked first, so that an error names its place in `examples`.
    fn pg_micro_batches(&self, examples: &[PgExample]) -> Result<(Vec<PgBatch>, usize), TrainError> {
        let with_reference = examples.first().is_some_and(|e| !e.reference.is_empty());
        for (index, example) in examples.iter().enumerate() {
            check(index, example, with_reference)?;
        }
        let (pad, max_seq_len) = (self.config().pad_token_id, self.config().max_seq_len);
        let mut batches = Vec::new();
        let mut truncated = 0;
        for chunk in longest_first_micro_batches(examples, PgExample::tokens, self.config()) {
            let (batch, cut) = PgBatch::new(&chunk, pad, max_seq_len)?;
            truncated += cut;
            batches.push(batch);
        }
        Ok((batches, truncated))
    }
}

/// The log-probabilities `model` gives each completion token of `examples` (no update), one
/// vector per example: what a reference model contributes to the KL penalty. Passes hold at
/// most `config.micro_batch_size` examples and `config.micro_batch_tokens` tokens, as a
/// training step's do ([`micro_batch_ranges`]; examples are not cut to `max_seq_len` here): a
/// pass without a graph still holds its logits, a row of the vocabulary per token.
pub fn completion_logprobs<M: TrainableModel>(
    model: &M,
    examples: &[SftExample],
    config: &TrainerConfig,
) -> Result<Vec<Vec<f32>>, TrainError> {
    if let Some(index) = examples.iter().position(|e| e.prompt.is_empty()) {
        return Err(TrainError::Batch(format!("example {index}: the prompt is empty")));
    }
    let mut out = Vec::with_capacity(examples.len());
    for range in logprob_passes(examples, config) {
        let chunk = &examples[range];
        let (batch, _) = SftBatch::from_examples(chunk, config.pad_token_id, usize::MAX);
        let values = if batch.tokens() == 0 { Vec::new() } else { token_logprobs(model, &batch)?.to_vec1::<f32>()? };
        let mut values = values.into_iter();
        for example in chunk {
            out.push(values.by_ref().take(example.completion.len()).collect());
        }
    }
    Ok(out)
}

/// The examples of each pass of [`completion_logprobs`]: [`micro_batch_ranges`] of their
/// whole lengths.
fn logprob_passes(examples: &[SftExample], config: &TrainerConfig) -> Vec<std::ops::Range<usize>> {
    let lengths: Vec<usize> = examples.iter().map(SftExample::tokens).collect();
    micro_batch_ranges(&lengths, &TrainerConfig { max_seq_len: usize::MAX, ..config.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(prompt: usize, completion: usize) -> SftExample {
        SftExample { prompt: vec![1; prompt], completion: vec![2; completion] }
    }

    #[test]
    fn reference_passes_keep_to_the_token_cap_on_whole_lengths() {
        let examples = [example(300, 20), example(600, 40), example(100, 10), example(900, 30), example(50, 5)];
        let config = TrainerConfig { micro_batch_size: 4, max_seq_len: 512, ..TrainerConfig::default() };
        assert_eq!(logprob_passes(&examples, &config), vec![0..4, 4..5], "no cap: runs of micro_batch_size");
        let capped = TrainerConfig { micro_batch_tokens: Some(1024), ..config };
        // 320 + 640 = 960; + 110 would pass 1,024; 110 + 930 would too (the lengths are not cut
        // to max_seq_len here: the pass reads whole examples).
        assert_eq!(logprob_passes(&examples, &capped), vec![0..2, 2..3, 3..5]);
    }
}
