//! `whale demo`, the first command of the README: WHALE and its five baselines on a real instruct
//! model, with the comparison table printed, the report written and the curves drawn.
//!
//! The setup is the QA testbed of SmolLM2-135M-Instruct (`examples/qa-smollm2.toml`, compiled in)
//! under the study's `--quick` ([`whale_study::study::quick`]) at seed 0, made smaller still so
//! that the six conditions fit in a quarter of an hour on two cores: test mean@2 instead of
//! mean@4 (the same 32 test tasks) and a budget of 96 training rollouts instead of 128 (three
//! weight steps of 8 tasks x 4 rollouts). At the quick size itself they took 17.6 minutes on an
//! AMD EPYC. The model is a few seconds away on PyPI. `--tiny` runs the earlier demo instead: the
//! tiny base model (trained on first use) on synthetic math, the settings of `examples/math.toml`.

use std::path::{Path, PathBuf};
use whale_core::Domain;
use whale_loop::condition::Condition;
use whale_loop::config::{ConfigError, RunConfig};
use whale_pretrain::{ensure_base_model, PretrainError};
use whale_study::compare::{Arm, ArmEvent};

/// The real-model demo's testbed, as the repository ships it.
pub const QA_TESTBED: &str = include_str!("../../../examples/qa-smollm2.toml");

/// Where the testbed comes from, for its errors.
const QA_TESTBED_FILE: &str = "examples/qa-smollm2.toml";

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the base model: {0}")]
    BaseModel(Box<PretrainError>),
    #[error(transparent)]
    Config(Box<ConfigError>),
}

/// Test rollouts per task in the demo.
const DEMO_K: usize = 2;
/// Training rollouts per condition in the demo.
const DEMO_BUDGET: u64 = 96;

/// The real-model demo's config, named `demo-smollm2`, its `[model] path` still the model's
/// short name (`smollm2`) for the caller to fetch and convert. The phase weights the study keeps
/// for its coupling matrix are not kept: the demo draws no matrix.
pub fn qa_config() -> Result<RunConfig, DemoError> {
    let base = PathBuf::from(".");
    let config =
        RunConfig::parse(QA_TESTBED, Path::new(QA_TESTBED_FILE), &base).map_err(|e| DemoError::Config(Box::new(e)))?;
    let mut config = whale_study::study::quick(RunConfig { seed: 0, ..config });
    config.name = "demo-smollm2".to_string();
    config.eval.k = DEMO_K;
    config.schedule.budget = DEMO_BUDGET;
    config.weights.keep_phase_weights = false;
    Ok(config)
}

/// The tiny demo's config: the defaults, named `demo`, on the default base model (made on first use).
pub fn tiny_config() -> Result<RunConfig, DemoError> {
    let model = ensure_base_model(Domain::Math).map_err(|e| DemoError::BaseModel(Box::new(e)))?;
    let mut config = RunConfig { name: "demo".to_string(), ..RunConfig::default() };
    config.model.path = Some(model);
    Ok(config)
}

/// Every condition, WHALE first.
pub fn arms() -> Vec<Arm> {
    Condition::ALL.into_iter().map(Arm::from).collect()
}

/// The line the demo shows when an arm starts or ends: which of the six it is and, from the arms
/// finished so far, about how long the rest will take.
pub fn arm_line(event: ArmEvent, finished_seconds: &[f64]) -> String {
    match event {
        ArmEvent::Started { arm, index, total } => {
            let eta = match finished_seconds {
                [] => "no estimate until the first condition ends".to_string(),
                done => {
                    let mean = done.iter().sum::<f64>() / done.len() as f64;
                    format!("about {:.0} min left", mean * (total - index) as f64 / 60.0)
                }
            };
            format!("condition {} of {total}: {arm} ({eta})", index + 1)
        }
        ArmEvent::Finished { arm, seconds } => format!("{arm} finished in {:.1} min", seconds / 60.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_model_demo_is_the_quick_qa_testbed_at_seed_0_made_smaller() {
        let config = qa_config().expect("the shipped testbed parses");
        assert_eq!((config.name.as_str(), config.seed, config.tasks.domain), ("demo-smollm2", 0, Domain::Qa));
        assert_eq!(config.model.path.as_deref().and_then(Path::file_name), Some("smollm2".as_ref()));
        assert_eq!((config.tasks.test, config.tasks.search, config.eval.k), (32, 16, 2));
        assert_eq!((config.schedule.budget, config.weights.tasks_per_step), (96, 8));
        assert!(!config.weights.keep_phase_weights);
    }

    #[test]
    fn the_estimate_is_the_mean_finished_arm_times_the_arms_left() {
        let arm = Arm::from(Condition::HarnessOnly);
        let started = ArmEvent::Started { arm, index: 2, total: 6 };
        assert_eq!(
            arm_line(started, &[]),
            "condition 3 of 6: harness-only (no estimate until the first condition ends)"
        );
        assert_eq!(arm_line(started, &[100.0, 140.0]), "condition 3 of 6: harness-only (about 8 min left)");
        let finished = ArmEvent::Finished { arm, seconds: 150.0 };
        assert_eq!(arm_line(finished, &[]), "harness-only finished in 2.5 min");
    }
}
