//! `whale demo`, the first command of the README: WHALE and its baselines on the default
//! offline setup (the tiny base model, synthetic math, the `mutate` proposer), with the
//! comparison table printed and the report written.
//!
//! The setup is [`RunConfig::default`] (the same settings as `examples/math.toml`), sized so the
//! six conditions finish within about ten minutes on two cores once the base model exists.

use std::path::Path;
use whale_core::Domain;
use whale_loop::condition::Condition;
use whale_loop::config::RunConfig;
use whale_loop::experiment::Verbosity;
use whale_pretrain::{ensure_base_model, PretrainError};
use whale_study::compare::{compare, Arm, CompareError, Comparison};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the base model: {0}")]
    BaseModel(Box<PretrainError>),
    #[error(transparent)]
    Compare(Box<CompareError>),
}

/// The demo's config: the defaults, named `demo`, on the default base model.
pub fn demo_config() -> Result<RunConfig, DemoError> {
    let model = ensure_base_model(Domain::Math).map_err(|e| DemoError::BaseModel(Box::new(e)))?;
    let mut config = RunConfig { name: "demo".to_string(), ..RunConfig::default() };
    config.model.path = Some(model);
    Ok(config)
}

/// Makes or reuses the base model, then compares every condition under `runs/demo/`.
pub fn demo(runs: &Path, verbosity: Verbosity) -> Result<Comparison, DemoError> {
    let config = demo_config()?;
    let arms: Vec<Arm> = Condition::ALL.into_iter().map(Arm::from).collect();
    compare(&config, &runs.join(&config.name), &arms, verbosity).map_err(|e| DemoError::Compare(Box::new(e)))
}
