//! The weight phase with an external trainer (`[weights.trainer]`): a step's kept model calls go
//! to the command as chat JSONL, and the adapter or checkpoint it writes becomes the policy's
//! weights — hot-loaded into the inference server, or loaded into the in-process engine.
//!
//! A step's files, in `weights/step-NNNNNN/`:
//!
//! ```text
//! samples.jsonl          one line per trained model call (a [`Sample`]), in the order whale's
//!                        own trainer would take them
//! rollouts.json          the step's rollout report and the kept rollouts the proposer sees
//!                        (a [`RolloutRecord`]), written after samples.jsonl
//! train.log              the command's stdout and stderr
//! adapter/, checkpoint/  `{output}`: what the command wrote
//! ```
//!
//! Why rollouts are recorded: on a cluster a step's rollouts cost GPU-hours, and the command may
//! fail for reasons of its own (a node lost, out of memory). A step is committed to `state.json`
//! only once its new weights are installed; a failed or killed step is retried from its
//! `rollouts.json` when one was written, so its rollouts are neither run nor counted twice, and
//! the command runs again into a fresh output directory. When a run resumes, the weights of the
//! last committed update are installed again (the server may have restarted meanwhile).

use crate::run_dir::{read_json, write_atomic, write_json, RunDirError, ServedWeights};
use crate::scale_out::server::{ServedPolicy, ServerAdmin, ServerError};
use crate::scale_out::trainer_command::{
    Placeholders, TrainerCommandConfig, TrainerCommandError, TrainerOutput, TrainerRun,
};
use crate::weight_phase::{Signal, StepReport, WeightPhaseError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use whale_core::{ChatMessage, ModelCall, SampledTokens, Trajectory};
use whale_engine::LocalPolicy;
use whale_lm::Decoder;

/// One line of `samples.jsonl`: a model call as a chat, its completion the final assistant
/// turn, and which turns are trained on (only that last one). Under a policy gradient
/// (`algorithm = "grpo"` or `"rloo"`) a line also carries its rollout's advantage, the sampled
/// token ids of the completion and the log-probability the sampling policy gave each; the
/// advantages of a task's k rollouts sum to zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub messages: Vec<ChatMessage>,
    /// One flag per message: true for the turns to train on.
    pub trainable: Vec<bool>,
    /// `stop` (the model ended its turn) or `length` (cut off at `max_tokens`); absent: `stop`.
    #[serde(default = "stop")]
    pub finish_reason: String,
    /// Policy gradient: the advantage of the rollout this call belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage: Option<f64>,
    /// Policy gradient: the index of the rollout's group (its task within the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<usize>,
    /// Policy gradient: the index of the rollout within the step (a rollout of several calls
    /// has a line per call, each with the rollout's advantage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<usize>,
    /// Policy gradient: the completion as sampled, token by token (the end-of-turn token
    /// included when one was sampled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completion_token_ids: Vec<u32>,
    /// Policy gradient: per completion token, its log-probability under the sampling policy
    /// (temperature 1, whole vocabulary).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behaviour_logprobs: Vec<f32>,
}

fn stop() -> String {
    "stop".to_string()
}

/// What a trainer learns from a [`Sample`]: the reply to its context.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleReply {
    pub context: Vec<ChatMessage>,
    pub completion: String,
    /// Whether the reply ended its turn (`stop`): trained with the end-of-turn token.
    pub ends_turn: bool,
}

impl Sample {
    pub fn from_call(call: &ModelCall) -> Self {
        let mut messages = call.messages.clone();
        messages.push(ChatMessage::new("assistant", call.completion.clone()));
        let mut trainable = vec![false; messages.len()];
        trainable[messages.len() - 1] = true;
        Self {
            messages,
            trainable,
            finish_reason: call.finish_reason.clone(),
            advantage: None,
            group: None,
            rollout: None,
            completion_token_ids: Vec::new(),
            behaviour_logprobs: Vec::new(),
        }
    }

    /// The sample of a call for a policy gradient, its tokens as `sampled`.
    pub fn with_advantage(
        call: &ModelCall,
        sampled: &SampledTokens,
        advantage: f64,
        rollout: usize,
        group: usize,
    ) -> Self {
        Self {
            advantage: Some(advantage),
            group: Some(group),
            rollout: Some(rollout),
            completion_token_ids: sampled.ids.clone(),
            behaviour_logprobs: sampled.logprobs.clone(),
            ..Self::from_call(call)
        }
    }

    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The last trainable turn (an assistant message) as the reply, the messages before it as
    /// its context; or the field at fault and why.
    pub fn reply(mut self) -> Result<SampleReply, (&'static str, String)> {
        if self.trainable.len() != self.messages.len() {
            let reason = format!("{} flags for {} messages", self.trainable.len(), self.messages.len());
            return Err(("trainable", reason));
        }
        let last =
            self.trainable.iter().rposition(|&flag| flag).ok_or(("trainable", "no trainable turn".to_string()))?;
        if last == 0 || self.messages[last].role != "assistant" {
            let reason = format!("turn {last} is trainable but is not an assistant reply to earlier messages");
            return Err(("trainable", reason));
        }
        let ends_turn = match self.finish_reason.as_str() {
            "stop" => true,
            "length" => false,
            other => return Err(("finish_reason", format!("expected \"stop\" or \"length\", got {other:?}"))),
        };
        self.messages.truncate(last + 1);
        let completion = self.messages.pop().map(|m| m.content).unwrap_or_default();
        Ok(SampleReply { context: self.messages, completion, ends_turn })
    }
}

/// The samples of a policy-gradient step with the completion tokens of each: every call
/// [`Signal::trained_calls`] yields, in that order. Fails on a call whose sampled tokens the
/// policy did not report.
pub fn policy_gradient_samples(
    trajectories: &[Trajectory],
    signal: &Signal,
) -> Result<Vec<(Sample, usize)>, WeightPhaseError> {
    signal
        .trained_calls(trajectories)
        .map(|trained| {
            let sample = Sample::with_advantage(
                trained.call,
                trained.sampled()?,
                trained.advantage,
                trained.rollout,
                trained.group,
            );
            Ok((sample, trained.call.completion_tokens))
        })
        .collect()
}

/// `rollouts.json`: what a step's rollouts produced, kept so that a retried step does not roll
/// out again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// The step's report before training (`updates` 0); `trained_tokens` counts the samples'
    /// completion tokens as the policy reported them.
    pub report: StepReport,
    /// The kept rollouts the proposer is shown.
    pub examples: Vec<Trajectory>,
}

/// The files of one weight step.
#[derive(Debug, Clone)]
pub struct StepFiles {
    dir: PathBuf,
}

impl StepFiles {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn samples(&self) -> PathBuf {
        self.dir.join("samples.jsonl")
    }

    pub fn record(&self) -> PathBuf {
        self.dir.join("rollouts.json")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("train.log")
    }

    /// `{metrics}`: what the trainer says of its own update, if it says anything.
    pub fn trainer_metrics(&self) -> PathBuf {
        self.dir.join("trainer_metrics.json")
    }

    /// The mean loss the trainer wrote to [`Self::trainer_metrics`] (`{"loss": x}`), if it wrote
    /// the file; a file that is there but not of that form is an error naming it.
    pub fn trainer_loss(&self) -> Result<Option<f64>, ExternalWeightsError> {
        let path = self.trainer_metrics();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(ExternalWeightsError::Metrics { path, reason: error.to_string() }),
        };
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ExternalWeightsError::Metrics { path: path.clone(), reason: e.to_string() })?;
        match value.get("loss") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(loss) => loss.as_f64().filter(|l| l.is_finite()).map(Some).ok_or_else(|| {
                ExternalWeightsError::Metrics { path, reason: format!("`loss` must be a finite number, not {loss}") }
            }),
        }
    }

    pub fn output(&self, kind: TrainerOutput) -> PathBuf {
        self.dir.join(kind.dir_name())
    }

    /// The record of an earlier attempt of this step, if it got that far.
    pub fn read_record(&self) -> Result<Option<RolloutRecord>, RunDirError> {
        let path = self.record();
        if !path.is_file() {
            return Ok(None);
        }
        read_json(&path).map(Some)
    }

    /// Writes the samples, then the record (its presence says both are complete).
    pub fn write(&self, samples: &[Sample], record: &RolloutRecord) -> Result<(), RunDirError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| RunDirError::Io { path: self.dir.clone(), source })?;
        let text: String = samples.iter().map(|s| s.to_json_line() + "\n").collect();
        write_atomic(&self.samples(), text.as_bytes())?;
        write_json(&self.record(), record)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExternalWeightsError {
    #[error(transparent)]
    Command(#[from] TrainerCommandError),
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("weight step {step}: cannot load {} into the engine: {reason}", path.display())]
    Load { step: u64, path: PathBuf, reason: String },
    #[error("weight step {step}: the server did not take the new weights: {source}")]
    Server { step: u64, source: ServerError },
    /// The run's starting weights, put back on a server that replaces its weights in place.
    #[error("the server did not take the base weights {base}, which a run starts from: {source}")]
    Base { base: String, source: ServerError },
    #[error("{}: the trainer's metrics: {reason}", path.display())]
    Metrics { path: PathBuf, reason: String },
}

/// Where new weights go.
pub enum WeightsTarget {
    /// Hot-loaded into the inference server (adapters by name; checkpoints replace the weights
    /// of `base_model`, the served model's name), and rollouts routed to them.
    Server { admin: ServerAdmin, policy: Arc<ServedPolicy>, base_model: String },
    /// The in-process engine (no `[server]`); adapters apply to `base`, the model it started
    /// with, and checkpoints load in its dtype and onto its device.
    Local { policy: Arc<LocalPolicy>, base: Box<Decoder> },
}

/// The weight phase's external trainer and where its output is installed.
pub struct ExternalTrainer {
    pub config: TrainerCommandConfig,
    /// What `{base}` expands to.
    pub base: String,
    /// Installed weights are named `<prefix>-step-<N>`.
    pub name_prefix: String,
    pub target: WeightsTarget,
}

/// One run of the trainer for a step.
pub struct Update<'a> {
    pub step: u64,
    pub files: &'a StepFiles,
    /// The weights of the last update (`{previous}`), if any.
    pub previous: Option<&'a ServedWeights>,
    /// The weights version the new weights become.
    pub version: u64,
    pub run_dir: &'a Path,
    pub progress: bool,
}

impl ExternalTrainer {
    /// Runs the command on the step's samples and installs what it wrote; returns the new
    /// weights and the seconds the command took.
    pub fn update(&self, update: &Update) -> Result<(ServedWeights, f64), ExternalWeightsError> {
        let output = update.files.output(self.config.output);
        let placeholders = Placeholders {
            data: update.files.samples(),
            base: self.base.clone(),
            previous: update.previous.map(|weights| weights.path.clone()),
            output: output.clone(),
            metrics: update.files.trainer_metrics(),
            step: update.step,
            run_dir: update.run_dir.to_path_buf(),
        };
        // A metrics file left by an earlier attempt of this step is not this attempt's.
        let metrics = update.files.trainer_metrics();
        if metrics.exists() {
            std::fs::remove_file(&metrics)
                .map_err(|e| ExternalWeightsError::Metrics { path: metrics.clone(), reason: e.to_string() })?;
        }
        let log = update.files.log();
        let run =
            TrainerRun { config: &self.config, placeholders: &placeholders, log: &log, progress: update.progress };
        let seconds = run.run()?;
        let weights = ServedWeights {
            step: update.step,
            name: format!("{}-step-{}", self.name_prefix, update.step),
            path: output,
        };
        self.install(&weights, update.version)?;
        if let (WeightsTarget::Server { admin, .. }, Some(previous)) = (&self.target, update.previous) {
            if self.config.output == TrainerOutput::Adapter {
                admin
                    .unload_adapter(&previous.name)
                    .map_err(|source| ExternalWeightsError::Server { step: update.step, source })?;
            }
        }
        Ok((weights, seconds))
    }

    /// Makes `weights` the policy's weights, as version `version`.
    pub fn install(&self, weights: &ServedWeights, version: u64) -> Result<(), ExternalWeightsError> {
        let failed =
            |reason: String| ExternalWeightsError::Load { step: weights.step, path: weights.path.clone(), reason };
        match &self.target {
            WeightsTarget::Server { admin, policy, base_model } => {
                let served = match self.config.output {
                    TrainerOutput::Adapter => admin.load_adapter(&weights.name, &weights.path).map(|()| &weights.name),
                    TrainerOutput::Checkpoint => admin.load_checkpoint(&weights.path).map(|()| base_model),
                };
                let served = served.map_err(|source| ExternalWeightsError::Server { step: weights.step, source })?;
                policy.route(served, version);
                Ok(())
            }
            WeightsTarget::Local { policy, base } => {
                let model = match self.config.output {
                    TrainerOutput::Checkpoint => {
                        Decoder::load(&weights.path, base.dtype(), base.device()).map_err(|e| failed(e.to_string()))?
                    }
                    TrainerOutput::Adapter => {
                        base.with_peft_adapter(&weights.path).map_err(|e| failed(e.to_string()))?
                    }
                };
                policy.reload(model, version).map_err(|e| failed(e.to_string()))
            }
        }
    }

    /// Puts the base weights back where full checkpoints replace them in place (a server's
    /// served model), so a run that has made no update yet starts from `{base}`, not from
    /// what an earlier run (another condition of a `whale compare`) left there. Adapters need
    /// nothing: the base model is never changed by them.
    pub fn install_base(&self, version: u64) -> Result<(), ExternalWeightsError> {
        let WeightsTarget::Server { admin, policy, base_model } = &self.target else { return Ok(()) };
        if self.config.output == TrainerOutput::Adapter {
            return Ok(());
        }
        admin
            .load_checkpoint(Path::new(&self.base))
            .map_err(|source| ExternalWeightsError::Base { base: self.base.clone(), source })?;
        policy.route(base_model, version);
        Ok(())
    }

    /// Releases the weights an update replaced: a checkpoint directory is removed (adapters,
    /// small, stay for inspection). Called once the update is committed.
    pub fn retire(&self, replaced: &ServedWeights) -> Result<(), ExternalWeightsError> {
        if self.config.output == TrainerOutput::Checkpoint && replaced.path.is_dir() {
            std::fs::remove_dir_all(&replaced.path)
                .map_err(|source| RunDirError::Io { path: replaced.path.clone(), source })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_the_call_with_its_completion_as_the_trained_last_turn() {
        let call = ModelCall {
            messages: vec![
                ChatMessage::new("system", "Solve."),
                ChatMessage::new("user", "2+2?"),
                ChatMessage::new("assistant", "Let me see."),
                ChatMessage::new("user", "Go on."),
            ],
            completion: "4\n#### 4".to_string(),
            prompt_tokens: 20,
            completion_tokens: 5,
            trainable: true,
            finish_reason: "stop".to_string(),
            latency_ms: 1.0,
            sampled: None,
        };
        let sample = Sample::from_call(&call);
        assert_eq!(sample.messages.len(), 5);
        assert_eq!(sample.messages[4], ChatMessage::new("assistant", "4\n#### 4"));
        assert_eq!(sample.trainable, [false, false, false, false, true]);
        let line: serde_json::Value = serde_json::from_str(&sample.to_json_line()).expect("json");
        assert_eq!(line["finish_reason"], "stop");
        assert_eq!(line["messages"][2]["role"], "assistant");
        assert_eq!(line["trainable"][4], true);
    }
}
