//! A study's result files: one per (config, seed), `results/<config>-seed-<s>.json`, written
//! when that seed's comparison and coupling matrix are done.
//!
//! A file holds everything the study's tables, verdicts and figures are computed from (each
//! arm's test evaluations with their per-task means, its ledger, the coupling matrix) and where
//! it came from (the CPU, the whale build, the wall time), in kilobytes and without
//! checkpoints, so that it can be committed and copied between machines. It also holds the
//! config it ran, made portable (directories dropped from paths, the seed cleared: the file
//! name carries it) and hashed: a file is refused by a study whose config hashes otherwise, and
//! the refusal names the file and the keys that differ.

use super::error::StudyError;
use crate::compare::Arm;
use crate::coupling::Coupling;
use crate::report::{self, CurvePoint, Series};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use whale_core::{CpuInfo, Estimate, Ledger};
use whale_loop::condition::Condition;
use whale_loop::config::{Algorithm, RunConfig};
use whale_loop::run_dir::{read_json, write_atomic};

/// The results directory inside a study's directory, unless `--results` names another.
pub const RESULTS_DIR: &str = "results";

/// The layout of the files this build writes and reads.
pub const FORMAT: u32 = 1;

/// The result file of `config` under `seed` in `results`.
pub fn result_path(results: &Path, config: &str, seed: u64) -> PathBuf {
    results.join(format!("{config}-seed-{seed}.json"))
}

/// One (config, seed) of a study, as its result file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    pub format: u32,
    /// The config's name.
    pub config: String,
    pub seed: u64,
    /// SHA-256 of [`portable`] config, as compact JSON.
    pub config_hash: String,
    pub whale: WhaleBuild,
    /// The CPU of the invocation that finished this seed.
    pub cpu: CpuInfo,
    /// Seconds this seed took in the invocation that finished it (the arms' ledgers hold the
    /// phases of every invocation).
    pub wall_s: f64,
    /// In the order `whale compare` lists its runs.
    pub arms: Vec<ArmResult>,
    /// The WHALE run's coupling matrix; `None` when the study ran no plain `whale` arm.
    pub coupling: Option<Coupling>,
    /// The [`portable`] config the hash is of.
    pub config_used: Value,
}

/// The whale that wrote a result file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhaleBuild {
    pub version: String,
    /// The git commit `HEAD` was at when whale was built (changes beyond it are not marked);
    /// `None` when built outside a git checkout.
    pub commit: Option<String>,
}

impl WhaleBuild {
    pub fn this() -> WhaleBuild {
        WhaleBuild {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: option_env!("WHALE_COMMIT").map(String::from),
        }
    }
}

/// One arm of one seed: its test evaluations and what it spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmResult {
    pub condition: Condition,
    /// The weight-phase algorithm the arm named (`weight-only:grpo`); `None`: the config's.
    pub algorithm: Option<Algorithm>,
    /// Rollouts, tokens and wall time by purpose.
    pub ledger: Ledger,
    /// Every test evaluation, in order.
    pub evaluations: Vec<Evaluation>,
}

/// One test evaluation of an arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Training rollouts spent before it.
    pub training_rollouts: u64,
    pub mean: Estimate,
    pub pass: f64,
    pub maj: f64,
    pub k: usize,
    /// Each test task's mean reward, in test-split order.
    pub task_means: Vec<f64>,
}

impl From<&CurvePoint> for Evaluation {
    fn from(point: &CurvePoint) -> Self {
        Evaluation {
            training_rollouts: point.training_rollouts,
            mean: point.mean,
            pass: point.pass,
            maj: point.maj,
            k: point.k,
            task_means: point.task_means.clone(),
        }
    }
}

impl ArmResult {
    pub fn arm(&self) -> Arm {
        Arm { condition: self.condition, algorithm: self.algorithm }
    }

    /// The best evaluation (highest mean, earliest among equals) and the last one.
    pub fn best_and_final(&self) -> Option<(&Evaluation, &Evaluation)> {
        let last = self.evaluations.last()?;
        let best =
            self.evaluations.iter().fold(&self.evaluations[0], |b, e| if e.mean.value > b.mean.value { e } else { b });
        Some((best, last))
    }

    /// The training rollouts spent when the curve first reached `target`.
    pub fn rollouts_to_reach(&self, target: f64) -> Option<u64> {
        self.evaluations.iter().find(|e| e.mean.value >= target - 1e-12).map(|e| e.training_rollouts)
    }
}

/// What a result file must match to count for a (config, seed) of a study.
#[derive(Debug, Clone)]
pub struct Expected {
    config: String,
    seed: u64,
    arms: Vec<String>,
    config_used: Value,
    hash: String,
}

impl Expected {
    /// `config` as the study runs it under its seed; `arms` the study's.
    pub fn of(config: &RunConfig, arms: &[Arm]) -> Expected {
        let config_used = portable(config);
        let hash = hash(&config_used);
        let mut arms: Vec<String> = arms.iter().map(Arm::name).collect();
        arms.sort();
        Expected { config: config.name.clone(), seed: config.seed, arms, config_used, hash }
    }

    /// Why `result` is not this (config, seed)'s; `None` when it is.
    fn mismatch(&self, result: &SeedResult) -> Option<String> {
        if result.format != FORMAT {
            return Some(format!("written in result format {}, this whale reads {FORMAT}", result.format));
        }
        if (result.config.as_str(), result.seed) != (self.config.as_str(), self.seed) {
            return Some(format!(
                "holds config `{}` seed {}, not `{}` seed {}",
                result.config, result.seed, self.config, self.seed
            ));
        }
        if result.config_hash != self.hash {
            let mut keys = Vec::new();
            differing_keys(&result.config_used, &self.config_used, "", &mut keys);
            return Some(format!(
                "made with another config (hash {} in the file, {} here): {}",
                short(&result.config_hash),
                short(&self.hash),
                if keys.is_empty() { "the hashes differ".to_string() } else { keys.join("; ") }
            ));
        }
        let mut arms: Vec<String> = result.arms.iter().map(|arm| arm.arm().name()).collect();
        arms.sort();
        (arms != self.arms).then(|| format!("holds conditions {arms:?}, this study runs {:?}", self.arms))
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// The leaves where `file` and `here` differ, as `key.path = A in the file, B here`.
fn differing_keys(file: &Value, here: &Value, prefix: &str, out: &mut Vec<String>) {
    match (file, here) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                differing_keys(a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null), &path, out);
            }
        }
        _ if file != here => out.push(format!("{prefix} = {file} in the file, {here} here")),
        _ => {}
    }
}

/// The config with what differs between machines running the same experiment taken out: the
/// directories of its paths (the model, task files, corpus, trainer directory, initial harness
/// keep their names) and the seed (a study sets it; the file name carries it).
pub fn portable(config: &RunConfig) -> Value {
    let mut config = config.clone();
    config.seed = 0;
    let name = |path: &Path| path.file_name().map_or_else(|| path.to_path_buf(), PathBuf::from);
    config.model.path = config.model.path.as_deref().map(name);
    config.tasks.files = config.tasks.files.iter().map(|file| name(file)).collect();
    config.tasks.corpus = config.tasks.corpus.as_deref().map(name);
    if let Some(trainer) = &mut config.weights.trainer {
        trainer.workdir = trainer.workdir.as_deref().map(name);
    }
    config.harness.initial = name(Path::new(&config.harness.initial)).display().to_string();
    serde_json::to_value(&config).unwrap_or_default()
}

fn hash(config: &Value) -> String {
    format!("{:x}", Sha256::digest(config.to_string().as_bytes()))
}

impl SeedResult {
    /// The result of the finished runs of `arms` in `seed_dir` (a `whale compare` directory of
    /// `config`, already seeded) and its WHALE run's coupling matrix.
    pub fn of_runs(
        config: &RunConfig,
        arms: &[Arm],
        seed_dir: &Path,
        coupling: Option<Coupling>,
        wall_s: f64,
    ) -> Result<SeedResult, StudyError> {
        let mut runs = Vec::new();
        for dir in report::run_dirs(seed_dir)? {
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if let Some(&arm) = arms.iter().find(|arm| arm.name() == name) {
                runs.push((arm, Series::read(&dir)?));
            }
        }
        if let Some(arm) = arms.iter().find(|arm| !runs.iter().any(|(run, series)| run == *arm && series.finished)) {
            let reason = format!("the run of `{arm}` has not finished");
            return Err(StudyError::Read { path: seed_dir.to_path_buf(), reason });
        }
        let config_used = portable(config);
        Ok(SeedResult {
            format: FORMAT,
            config: config.name.clone(),
            seed: config.seed,
            config_hash: hash(&config_used),
            whale: WhaleBuild::this(),
            cpu: CpuInfo::detect(),
            wall_s,
            arms: runs.into_iter().map(|(arm, series)| ArmResult::of(arm, &series)).collect(),
            coupling,
            config_used,
        })
    }

    /// Writes the file atomically (a temporary file renamed over it), creating its directory.
    pub fn write(&self, path: &Path) -> Result<(), StudyError> {
        let failed = |reason: String| StudyError::Write { path: path.to_path_buf(), reason };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| failed(e.to_string()))?;
        }
        let text = serde_json::to_string(self).map_err(|e| failed(e.to_string()))? + "\n";
        write_atomic(path, text.as_bytes()).map_err(|e| failed(e.to_string()))
    }

    /// Reads the file at `path`, refusing it unless it is `expected`'s.
    pub fn read(path: &Path, expected: &Expected) -> Result<SeedResult, StudyError> {
        let result: SeedResult =
            read_json(path).map_err(|e| StudyError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        match expected.mismatch(&result) {
            Some(reason) => Err(StudyError::Refused { path: path.to_path_buf(), reason }),
            None => Ok(result),
        }
    }
}

impl ArmResult {
    fn of(arm: Arm, series: &Series) -> ArmResult {
        ArmResult {
            condition: arm.condition,
            algorithm: arm.algorithm,
            ledger: series.ledger.clone(),
            evaluations: series.points.iter().map(Evaluation::from).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_ignores_directories_and_the_seed_and_a_change_is_named() {
        let mut here = RunConfig::default();
        here.model.path = Some(PathBuf::from("/home/a/models/SmolLM2"));
        here.tasks.files = vec![PathBuf::from("/home/a/data/gsm8k.jsonl")];
        let mut there = here.clone();
        there.seed = 7;
        there.model.path = Some(PathBuf::from("/work/models/SmolLM2"));
        there.tasks.files = vec![PathBuf::from("/mnt/data/gsm8k.jsonl")];
        let arms = [Arm::from(Condition::WeightOnly)];
        assert_eq!(Expected::of(&here, &arms).hash, Expected::of(&there, &arms).hash, "another machine, same run");

        there.schedule.budget += 1;
        there.model.path = Some(PathBuf::from("/work/models/Qwen3"));
        let expected = Expected::of(&here, &arms);
        let result = SeedResult {
            format: FORMAT,
            config: here.name.clone(),
            seed: here.seed,
            config_hash: hash(&portable(&there)),
            whale: WhaleBuild::this(),
            cpu: CpuInfo::detect(),
            wall_s: 1.0,
            arms: vec![ArmResult {
                condition: Condition::WeightOnly,
                algorithm: None,
                ledger: Ledger::default(),
                evaluations: Vec::new(),
            }],
            coupling: None,
            config_used: portable(&there),
        };
        let reason = expected.mismatch(&result).expect("another config");
        assert!(reason.contains("model.path = \"Qwen3\" in the file, \"SmolLM2\" here"), "{reason}");
        let budget = format!("schedule.budget = {} in the file, {} here", there.schedule.budget, here.schedule.budget);
        assert!(reason.contains(&budget), "{reason}");

        let same = SeedResult { config_hash: expected.hash.clone(), config_used: portable(&here), ..result };
        assert_eq!(expected.mismatch(&same), None);
        let more_arms = Expected::of(&here, &[Arm::from(Condition::Whale), Arm::from(Condition::WeightOnly)]);
        let reason = more_arms.mismatch(&same).expect("another set of conditions");
        assert!(
            reason.contains(r#"holds conditions ["weight-only"], this study runs ["weight-only", "whale"]"#),
            "{reason}"
        );
    }
}
