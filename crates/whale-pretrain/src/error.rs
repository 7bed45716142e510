//! Why pretraining or evaluating a base model failed: the model, trainer and harness errors it
//! passes on, and its own (a file, an empty corpus, a missing stock harness).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PretrainError {
    #[error(transparent)]
    Codec(#[from] whale_train::ChatCodecError),
    #[error(transparent)]
    Tokenizer(#[from] whale_text::TokenizerError),
    #[error(transparent)]
    Template(#[from] whale_text::ChatTemplateError),
    #[error(transparent)]
    Train(#[from] whale_train::TrainError),
    #[error(transparent)]
    Model(#[from] whale_lm::ModelError),
    #[error(transparent)]
    Checkpoint(#[from] whale_lm::CheckpointError),
    #[error(transparent)]
    Policy(#[from] whale_policy::PolicyError),
    #[error(transparent)]
    Engine(#[from] whale_engine::EngineError),
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("the corpus gave no training example of at most {0} tokens")]
    EmptyCorpus(usize),
    #[error(transparent)]
    Evaluate(#[from] whale_harness::scoring::EvaluateError),
    #[error("no stock harness `{0}` to evaluate with")]
    NoHarness(&'static str),
}
