//! A study's result files: one per (config, seed), `results/<config>-seed-<s>.json`, written
//! when that seed's comparison and coupling matrix are done.
//!
//! A seed of a real model can take longer than a machine is held, so each arm's part of the
//! file is written as soon as that arm finishes, `results/arms/<config>-seed-<s>-<arm>.json`
//! (the WHALE arm's with its coupling matrix, scored right after it while its phase weights
//! are still on disk). Those arm files are committed and copied like seed files: a study that
//! finds one does not run that arm again, and when every arm of a seed has one, they are joined
//! into the seed's file and removed.
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

/// The directory of the arm files inside a results directory.
pub const ARMS_DIR: &str = "arms";

/// The layout of the files this build writes and reads.
pub const FORMAT: u32 = 1;

/// The result file of `config` under `seed` in `results`.
pub fn result_path(results: &Path, config: &str, seed: u64) -> PathBuf {
    results.join(format!("{config}-seed-{seed}.json"))
}

/// The file of one finished arm of `config` under `seed` in `results`, until its seed's file
/// is written.
pub fn arm_path(results: &Path, config: &str, seed: u64, arm: Arm) -> PathBuf {
    results.join(ARMS_DIR).join(format!("{config}-seed-{seed}-{arm}.json"))
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
    /// Seconds of the invocations that finished its arms, summed (each arm's `ran` holds its
    /// own; an arm resumed after a kill counts its last invocation only, while the arms'
    /// ledgers hold the phases of every invocation).
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
    /// Where the arm finished: the arms of one seed may have run on different machines.
    /// `None` in files from before arms were recorded one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<ArmProvenance>,
}

/// The machine, build and time of the invocation that finished an arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmProvenance {
    pub cpu: CpuInfo,
    pub whale: WhaleBuild,
    /// Seconds in that invocation, the WHALE arm's coupling matrix included.
    pub wall_s: f64,
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
        self.mismatch_of(result, &self.arms, "this study runs")
    }

    /// Why `result` is not the file of `arm` of this (config, seed); `None` when it is.
    fn arm_mismatch(&self, result: &SeedResult, arm: Arm) -> Option<String> {
        self.mismatch_of(result, &[arm.name()], "this arm's file should hold")
    }

    fn mismatch_of(&self, result: &SeedResult, arms: &[String], expected: &str) -> Option<String> {
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
        let mut held: Vec<String> = result.arms.iter().map(|arm| arm.arm().name()).collect();
        held.sort();
        (held != arms).then(|| format!("holds conditions {held:?}, {expected} {arms:?}"))
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
    /// The file of `arm`, whose run in `seed_dir` (a `whale compare` directory of `config`,
    /// already seeded) has finished, with its coupling matrix if it is the WHALE arm;
    /// `wall_s` is what this invocation spent on it.
    pub fn of_arm(
        config: &RunConfig,
        arm: Arm,
        seed_dir: &Path,
        coupling: Option<Coupling>,
        wall_s: f64,
    ) -> Result<SeedResult, StudyError> {
        let dir = seed_dir.join(arm.name());
        let series = Series::read(&dir)?;
        if !series.finished {
            return Err(StudyError::Read { path: dir, reason: format!("the run of `{arm}` has not finished") });
        }
        let ran = ArmProvenance { cpu: CpuInfo::detect(), whale: WhaleBuild::this(), wall_s };
        let config_used = portable(config);
        Ok(SeedResult {
            format: FORMAT,
            config: config.name.clone(),
            seed: config.seed,
            config_hash: hash(&config_used),
            whale: ran.whale.clone(),
            cpu: ran.cpu.clone(),
            wall_s,
            arms: vec![ArmResult::of(arm, &series, ran)],
            coupling,
            config_used,
        })
    }

    /// The seed's file from the files of its arms (each read with [`SeedResult::read_arm`]):
    /// the arms in the order `whale compare` lists its runs, the WHALE arm's coupling matrix,
    /// and the seconds of all of them; the CPU and build are this invocation's, each arm keeps
    /// its own.
    pub fn joined(mut parts: Vec<SeedResult>) -> Option<SeedResult> {
        parts.sort_by_key(|part| part.arms.first().map(|arm| report::run_order(&arm.arm().name())));
        let first = parts.first()?.clone();
        let whale = Arm::from(Condition::Whale);
        let coupling = parts.iter().find(|p| p.arms.iter().any(|a| a.arm() == whale)).and_then(|p| p.coupling.clone());
        Some(SeedResult {
            whale: WhaleBuild::this(),
            cpu: CpuInfo::detect(),
            wall_s: parts.iter().map(|part| part.wall_s).sum(),
            arms: parts.into_iter().flat_map(|part| part.arms).collect(),
            coupling,
            ..first
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

    /// Reads the file of `arm` at `path`, refusing it unless it is that arm's of `expected`.
    pub fn read_arm(path: &Path, expected: &Expected, arm: Arm) -> Result<SeedResult, StudyError> {
        let result: SeedResult =
            read_json(path).map_err(|e| StudyError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        match expected.arm_mismatch(&result, arm) {
            Some(reason) => Err(StudyError::Refused { path: path.to_path_buf(), reason }),
            None => Ok(result),
        }
    }
}

impl ArmResult {
    fn of(arm: Arm, series: &Series, ran: ArmProvenance) -> ArmResult {
        ArmResult {
            condition: arm.condition,
            algorithm: arm.algorithm,
            ledger: series.ledger.clone(),
            evaluations: series.points.iter().map(Evaluation::from).collect(),
            ran: Some(ran),
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
                ran: None,
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
        assert_eq!(expected.arm_mismatch(&same, Arm::from(Condition::WeightOnly)), None);
        let reason = expected.arm_mismatch(&same, Arm::from(Condition::Whale)).expect("another arm's file");
        assert!(
            reason.contains(r#"holds conditions ["weight-only"], this arm's file should hold ["whale"]"#),
            "{reason}"
        );
        let more_arms = Expected::of(&here, &[Arm::from(Condition::Whale), Arm::from(Condition::WeightOnly)]);
        let reason = more_arms.mismatch(&same).expect("another set of conditions");
        assert!(
            reason.contains(r#"holds conditions ["weight-only"], this study runs ["weight-only", "whale"]"#),
            "{reason}"
        );
    }
}
