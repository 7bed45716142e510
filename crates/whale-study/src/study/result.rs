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
//!
//! The arms of a seed are compared task by task, so a file is refused (and never written) unless
//! every evaluation of every arm holds the same number of test task means, each finite; and
//! each arm names its test split by a digest ([`ArmResult::test_split`]), so that arms of one
//! seed run on two machines whose task files differ are refused rather than paired.

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
use whale_loop::experiment::task_splits;
use whale_loop::run_dir::{read_json, write_atomic, CONFIG_FILE};

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
    /// SHA-256 of the test split the arm evaluated on (each test task's id and payload, in
    /// order): two arms of a seed whose digests differ ran on other tasks and are not paired.
    /// `None` in files from before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_split: Option<String>,
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

impl Evaluation {
    /// Its first number JSON cannot hold (NaN or infinite), named.
    fn non_finite(&self) -> Option<String> {
        let (mean, pass, maj) = (self.mean, self.pass, self.maj);
        let named =
            [("mean.value", mean.value), ("mean.lo", mean.lo), ("mean.hi", mean.hi), ("pass", pass), ("maj", maj)];
        if let Some((name, value)) = named.into_iter().find(|(_, value)| !value.is_finite()) {
            return Some(format!("{name} is {value}"));
        }
        let (task, value) = self.task_means.iter().enumerate().find(|(_, value)| !value.is_finite())?;
        Some(format!("task_means[{task}] is {value}"))
    }
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

    /// Why this arm cannot be paired task by task with `first`, whose first evaluation has
    /// `tasks` test task means: no evaluation, one with no or another number of task means, or
    /// a number JSON cannot hold.
    fn unpairable(&self, (first, tasks): (Arm, usize)) -> Option<String> {
        if self.evaluations.is_empty() {
            return Some("no test evaluation".to_string());
        }
        self.evaluations.iter().enumerate().find_map(|(index, evaluation)| {
            let reason = match evaluation.task_means.len() {
                0 => Some("no test task means".to_string()),
                n if n != tasks => Some(format!("{n} test task means, where `{first}`'s first evaluation has {tasks}")),
                _ => evaluation.non_finite(),
            }?;
            Some(format!("evaluation {index} (after {} training rollouts): {reason}", evaluation.training_rollouts))
        })
    }
}

/// Why the arms of one seed cannot be compared task by task, and the arm that breaks it: one of
/// them is [unpairable](ArmResult::unpairable) against the first arm's test task count, or two
/// evaluated on test splits whose digests differ.
fn unpaired(arms: &[ArmResult]) -> Option<(Arm, String)> {
    let first = arms.first()?;
    let tasks = first.evaluations.first().map_or(0, |evaluation| evaluation.task_means.len());
    if let Some((arm, reason)) = arms.iter().find_map(|arm| Some((arm.arm(), arm.unpairable((first.arm(), tasks))?))) {
        return Some((arm, format!("arm `{arm}`: {reason}")));
    }
    let digests: Vec<(Arm, &str)> =
        arms.iter().filter_map(|arm| Some((arm.arm(), arm.test_split.as_deref()?))).collect();
    let (first, digest) = *digests.first()?;
    let &(other, differs) = digests.iter().find(|(_, other)| *other != digest)?;
    Some((
        other,
        format!(
            "arms `{first}` and `{other}` evaluated on different test splits (digest {} and {}): their task \
             files or configs differ, so their test tasks cannot be paired",
            short(digest),
            short(differs)
        ),
    ))
}

/// SHA-256 of the test split the run in `dir` evaluated on, as its own `config.toml` makes it
/// (the loop's [`task_splits`]): each test task's id and payload, in order.
fn test_split_digest(dir: &Path) -> Result<String, StudyError> {
    let file = dir.join(CONFIG_FILE);
    let failed = |reason: String| StudyError::Read { path: file.clone(), reason };
    let config = RunConfig::load(&file).map_err(|e| failed(e.to_string()))?;
    split_digest(&config).map_err(failed)
}

/// SHA-256 of the test split `config` makes: each test task's id and payload, in order.
pub(super) fn split_digest(config: &RunConfig) -> Result<String, String> {
    let test = task_splits(config).map_err(|e| format!("its test split: {e}"))?.test;
    Ok(hash(&Value::Array(test.into_iter().map(|task| serde_json::json!([task.id, task.payload])).collect())))
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
    pub fn of(config: &RunConfig, arms: &[Arm]) -> Result<Expected, StudyError> {
        let config_used = portable(config)?;
        let hash = hash(&config_used);
        let mut arms: Vec<String> = arms.iter().map(Arm::name).collect();
        arms.sort();
        Ok(Expected { config: config.name.clone(), seed: config.seed, arms, config_used, hash })
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
/// keep their names), the engine's prefix cache (memory spent for speed: it changes the
/// rounding, as the batching of concurrent calls already does, not the experiment) and the
/// seed (a study sets it; the file name carries it).
pub fn portable(config: &RunConfig) -> Result<Value, StudyError> {
    let mut config = config.clone();
    config.seed = 0;
    config.model.prefix_cache_tokens = 0;
    let name = |path: &Path| path.file_name().map_or_else(|| path.to_path_buf(), PathBuf::from);
    config.model.path = config.model.path.as_deref().map(name);
    config.tasks.files = config.tasks.files.iter().map(|file| name(file)).collect();
    config.tasks.corpus = config.tasks.corpus.as_deref().map(name);
    if let Some(trainer) = &mut config.weights.trainer {
        trainer.workdir = trainer.workdir.as_deref().map(name);
    }
    config.harness.initial = name(Path::new(&config.harness.initial)).display().to_string();
    serde_json::to_value(&config)
        .map_err(|e| StudyError::Portable { config: config.name.clone(), reason: e.to_string() })
}

pub(super) fn hash(config: &Value) -> String {
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
        let test_split = test_split_digest(&dir)?;
        let config_used = portable(config)?;
        Ok(SeedResult {
            format: FORMAT,
            config: config.name.clone(),
            seed: config.seed,
            config_hash: hash(&config_used),
            whale: ran.whale.clone(),
            cpu: ran.cpu.clone(),
            wall_s,
            arms: vec![ArmResult::of(arm, &series, ran, test_split)],
            coupling,
            config_used,
        })
    }

    /// The seed's file from the files of its arms (each read with [`SeedResult::read_arm`] from
    /// `results`): the arms in the order `whale compare` lists its runs, the WHALE arm's
    /// coupling matrix, and the seconds of all of them; the CPU and build are this invocation's,
    /// each arm keeps its own. Refused ([`SeedResult::check_parts`]) unless the arms pair.
    pub fn joined(mut parts: Vec<SeedResult>, results: &Path) -> Result<Option<SeedResult>, StudyError> {
        SeedResult::check_parts(&parts, results)?;
        parts.sort_by_key(|part| part.arms.first().map(|arm| report::run_order(&arm.arm().name())));
        let Some(first) = parts.first().cloned() else { return Ok(None) };
        let whale = Arm::from(Condition::Whale);
        let coupling = parts.iter().find(|p| p.arms.iter().any(|a| a.arm() == whale)).and_then(|p| p.coupling.clone());
        Ok(Some(SeedResult {
            whale: WhaleBuild::this(),
            cpu: CpuInfo::detect(),
            wall_s: parts.iter().map(|part| part.wall_s).sum(),
            arms: parts.into_iter().flat_map(|part| part.arms).collect(),
            coupling,
            ..first
        }))
    }

    /// Refuses the arm files of one seed in `results` (each read with
    /// [`SeedResult::read_arm`]) whose arms do not pair task by task, naming the file of the
    /// arm that breaks it.
    pub fn check_parts(parts: &[SeedResult], results: &Path) -> Result<(), StudyError> {
        let arms: Vec<ArmResult> = parts.iter().flat_map(|part| part.arms.iter().cloned()).collect();
        let (Some(part), Some((arm, reason))) = (parts.first(), unpaired(&arms)) else { return Ok(()) };
        Err(StudyError::Unpaired { path: arm_path(results, &part.config, part.seed, arm), reason })
    }

    /// Refuses, before any arm of `config` (seeded) runs here, an arm file in `results` whose
    /// test split is not the one this machine's task files make for it: the arm run here would
    /// otherwise be refused only when the seed is joined, after it ran.
    pub fn check_split(config: &RunConfig, parts: &[SeedResult], results: &Path) -> Result<(), StudyError> {
        let recorded =
            parts.iter().flat_map(|part| &part.arms).find_map(|arm| Some((arm.arm(), arm.test_split.as_deref()?)));
        let Some((arm, recorded)) = recorded else { return Ok(()) };
        let path = arm_path(results, &config.name, config.seed, arm);
        let here = split_digest(config).map_err(|reason| StudyError::Read { path: path.clone(), reason })?;
        if here == recorded {
            return Ok(());
        }
        let reason = format!(
            "arm `{arm}` evaluated on test split {}, while this machine's task files make {}: the task files \
             differ, so an arm run here could not be paired with it",
            short(recorded),
            short(&here)
        );
        Err(StudyError::Unpaired { path, reason })
    }

    /// Writes the file atomically (a temporary file renamed over it), creating its directory;
    /// refused, writing nothing, when its arms do not pair (a file that could not be read back).
    pub fn write(&self, path: &Path) -> Result<(), StudyError> {
        if let Some((_, reason)) = unpaired(&self.arms) {
            return Err(StudyError::Unwritable { path: path.to_path_buf(), reason });
        }
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
        let mismatch = expected.mismatch(&result);
        result.checked(path, mismatch)
    }

    /// Reads the file of `arm` at `path`, refusing it unless it is that arm's of `expected`.
    pub fn read_arm(path: &Path, expected: &Expected, arm: Arm) -> Result<SeedResult, StudyError> {
        let result: SeedResult =
            read_json(path).map_err(|e| StudyError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        let mismatch = expected.arm_mismatch(&result, arm);
        result.checked(path, mismatch)
    }

    /// The file read from `path`, refused when it is not the one expected (`mismatch`) or when
    /// its arms do not pair task by task.
    fn checked(self, path: &Path, mismatch: Option<String>) -> Result<SeedResult, StudyError> {
        if let Some(reason) = mismatch {
            return Err(StudyError::Refused { path: path.to_path_buf(), reason });
        }
        match unpaired(&self.arms) {
            Some((_, reason)) => Err(StudyError::Unpaired { path: path.to_path_buf(), reason }),
            None => Ok(self),
        }
    }
}

impl ArmResult {
    fn of(arm: Arm, series: &Series, ran: ArmProvenance, test_split: String) -> ArmResult {
        ArmResult {
            condition: arm.condition,
            algorithm: arm.algorithm,
            ledger: series.ledger.clone(),
            evaluations: series.points.iter().map(Evaluation::from).collect(),
            ran: Some(ran),
            test_split: Some(test_split),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_ignores_directories_the_prefix_cache_and_the_seed_and_a_change_is_named() {
        let mut here = RunConfig::default();
        here.model.path = Some(PathBuf::from("/home/a/models/SmolLM2"));
        here.tasks.files = vec![PathBuf::from("/home/a/data/gsm8k.jsonl")];
        let mut there = here.clone();
        there.seed = 7;
        there.model.path = Some(PathBuf::from("/work/models/SmolLM2"));
        there.tasks.files = vec![PathBuf::from("/mnt/data/gsm8k.jsonl")];
        there.model.prefix_cache_tokens = 16_384;
        let arms = [Arm::from(Condition::WeightOnly)];
        let of = |config: &RunConfig, arms: &[Arm]| Expected::of(config, arms).expect("portable");
        assert_eq!(of(&here, &arms).hash, of(&there, &arms).hash, "another machine, same run");
        let key = "prefix_cache_tokens";
        assert!(!portable(&there).expect("portable").to_string().contains(key), "the hash predates {key}");

        there.schedule.budget += 1;
        there.model.path = Some(PathBuf::from("/work/models/Qwen3"));
        let expected = of(&here, &arms);
        let there_used = portable(&there).expect("portable");
        let result = SeedResult {
            format: FORMAT,
            config: here.name.clone(),
            seed: here.seed,
            config_hash: hash(&there_used),
            whale: WhaleBuild::this(),
            cpu: CpuInfo::detect(),
            wall_s: 1.0,
            arms: vec![ArmResult {
                condition: Condition::WeightOnly,
                algorithm: None,
                ledger: Ledger::default(),
                evaluations: Vec::new(),
                ran: None,
                test_split: None,
            }],
            coupling: None,
            config_used: there_used,
        };
        let reason = expected.mismatch(&result).expect("another config");
        assert!(reason.contains("model.path = \"Qwen3\" in the file, \"SmolLM2\" here"), "{reason}");
        let budget = format!("schedule.budget = {} in the file, {} here", there.schedule.budget, here.schedule.budget);
        assert!(reason.contains(&budget), "{reason}");

        let same =
            SeedResult { config_hash: expected.hash.clone(), config_used: expected.config_used.clone(), ..result };
        assert_eq!(expected.mismatch(&same), None);
        assert_eq!(expected.arm_mismatch(&same, Arm::from(Condition::WeightOnly)), None);
        let reason = expected.arm_mismatch(&same, Arm::from(Condition::Whale)).expect("another arm's file");
        assert!(
            reason.contains(r#"holds conditions ["weight-only"], this arm's file should hold ["whale"]"#),
            "{reason}"
        );
        let more_arms = of(&here, &[Arm::from(Condition::Whale), Arm::from(Condition::WeightOnly)]);
        let reason = more_arms.mismatch(&same).expect("another set of conditions");
        assert!(
            reason.contains(r#"holds conditions ["weight-only"], this study runs ["weight-only", "whale"]"#),
            "{reason}"
        );
    }

    const WHALE: Arm = Arm { condition: Condition::Whale, algorithm: None };
    const WEIGHT_ONLY: Arm = Arm { condition: Condition::WeightOnly, algorithm: None };

    /// An arm whose evaluations hold these task means, one evaluation each, 64 rollouts apart.
    fn arm(arm: Arm, evaluations: &[&[f64]], test_split: Option<&str>) -> ArmResult {
        let evaluation = |(index, task_means): (usize, &&[f64])| Evaluation {
            training_rollouts: 64 * index as u64,
            mean: Estimate { value: 0.5, lo: 0.25, hi: 0.75 },
            pass: 0.5,
            maj: 0.5,
            k: 2,
            task_means: task_means.to_vec(),
        };
        ArmResult {
            condition: arm.condition,
            algorithm: arm.algorithm,
            ledger: Ledger::default(),
            evaluations: evaluations.iter().enumerate().map(evaluation).collect(),
            ran: None,
            test_split: test_split.map(String::from),
        }
    }

    /// The file of `arms` of the default config's seed 0, and what a study of `study_arms`
    /// expects of it.
    fn file_of(arms: Vec<ArmResult>, study_arms: &[Arm]) -> (SeedResult, Expected) {
        let expected = Expected::of(&RunConfig::default(), study_arms).expect("portable");
        let result = SeedResult {
            format: FORMAT,
            config: expected.config.clone(),
            seed: expected.seed,
            config_hash: expected.hash.clone(),
            whale: WhaleBuild::this(),
            cpu: CpuInfo::detect(),
            wall_s: 1.0,
            arms,
            coupling: None,
            config_used: expected.config_used.clone(),
        };
        (result, expected)
    }

    /// `result` as a file at `path`, written as another whale might have (unchecked).
    fn put(path: &Path, result: &SeedResult) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dir");
        std::fs::write(path, serde_json::to_string(result).expect("json")).expect("written");
    }

    fn refusal(error: StudyError) -> String {
        assert!(matches!(error, StudyError::Unpaired { .. }), "{error}");
        error.to_string()
    }

    #[test]
    fn a_seed_file_whose_arms_do_not_pair_task_by_task_is_refused_naming_the_file_and_arm() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("math-seed-0.json");
        let both = [WHALE, WEIGHT_ONLY];
        let whale = arm(WHALE, &[&[0.5; 4], &[1.0; 4]], None);
        let cases: [(ArmResult, &str); 3] = [
            (
                arm(WEIGHT_ONLY, &[&[0.5; 4], &[0.5; 3]], None),
                "arm `weight-only`: evaluation 1 (after 64 training rollouts): 3 test task means, where `whale`'s \
                 first evaluation has 4",
            ),
            (
                arm(WEIGHT_ONLY, &[&[], &[]], None),
                "`weight-only`: evaluation 0 (after 0 training rollouts): no test task",
            ),
            (arm(WEIGHT_ONLY, &[], None), "arm `weight-only`: no test evaluation"),
        ];
        for (other, reason) in cases {
            let (result, expected) = file_of(vec![whale.clone(), other], &both);
            put(&path, &result);
            let refused = refusal(SeedResult::read(&path, &expected).expect_err("unpaired"));
            assert!(refused.contains(&path.display().to_string()) && refused.contains(reason), "{refused}");
        }
        let (result, expected) = file_of(vec![arm(WHALE, &[&[]], None)], &[WHALE]);
        put(&path, &result);
        let refused = refusal(SeedResult::read_arm(&path, &expected, WHALE).expect_err("no task means"));
        assert!(refused.contains("arm `whale`: evaluation 0 (after 0 training rollouts): no test task means"));

        let (result, expected) = file_of(vec![whale.clone(), arm(WEIGHT_ONLY, &[&[0.0; 4]], None)], &both);
        put(&path, &result);
        assert_eq!(SeedResult::read(&path, &expected).expect("pairs"), result);
    }

    #[test]
    fn arm_files_whose_evaluations_do_not_pair_are_not_joined_naming_the_arms_file() {
        let results = tempfile::tempdir().expect("tempdir");
        let both = [WHALE, WEIGHT_ONLY];
        let (whale, _) = file_of(vec![arm(WHALE, &[&[0.5; 192]], None)], &both);
        let (short, _) = file_of(vec![arm(WEIGHT_ONLY, &[&[0.5; 192], &[0.5; 191]], None)], &both);
        let refused = refusal(SeedResult::joined(vec![whale.clone(), short], results.path()).expect_err("unpaired"));
        let file = arm_path(results.path(), "math", 0, WEIGHT_ONLY);
        assert!(refused.contains(&file.display().to_string()), "{refused}");
        assert!(refused.contains("191 test task means, where `whale`'s first evaluation has 192"), "{refused}");

        let (fine, _) = file_of(vec![arm(WEIGHT_ONLY, &[&[0.0; 192]], None)], &both);
        let joined = SeedResult::joined(vec![fine, whale], results.path()).expect("pairs").expect("a seed");
        assert_eq!(joined.arms.iter().map(ArmResult::arm).collect::<Vec<_>>(), both);
    }

    #[test]
    fn arms_of_one_seed_evaluated_on_different_test_splits_are_refused_naming_both() {
        let results = tempfile::tempdir().expect("tempdir");
        let both = [WHALE, WEIGHT_ONLY];
        let tasks: &[f64] = &[0.5; 4];
        let part = |which, digest| file_of(vec![arm(which, &[tasks], digest)], &both).0;
        let parts = vec![part(WHALE, Some("aaaa")), part(WEIGHT_ONLY, Some("bbbb"))];
        let refused = refusal(SeedResult::joined(parts.clone(), results.path()).expect_err("other tasks"));
        let file = arm_path(results.path(), "math", 0, WEIGHT_ONLY);
        assert!(refused.contains(&file.display().to_string()), "{refused}");
        assert!(refused.contains("arms `whale` and `weight-only` evaluated on different test splits"), "{refused}");

        let path = results.path().join("math-seed-0.json");
        let (result, expected) = file_of(parts.into_iter().flat_map(|part| part.arms).collect(), &both);
        put(&path, &result);
        let refused = refusal(SeedResult::read(&path, &expected).expect_err("other tasks"));
        assert!(refused.contains("arms `whale` and `weight-only`") && refused.contains(&path.display().to_string()));

        for digests in [(Some("aaaa"), None), (Some("aaaa"), Some("aaaa")), (None, None)] {
            let parts = vec![part(WHALE, digests.0), part(WEIGHT_ONLY, digests.1)];
            assert!(SeedResult::joined(parts, results.path()).expect("the same tasks").is_some(), "{digests:?}");
        }
    }

    #[test]
    fn a_file_with_a_number_json_cannot_hold_is_not_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("arms").join("math-seed-0-whale.json");
        let mut whale = arm(WHALE, &[&[0.5; 4], &[0.5, 1.0, f64::NAN, 0.0]], None);
        let (result, _) = file_of(vec![whale.clone()], &[WHALE]);
        let error = result.write(&path).expect_err("NaN");
        assert!(matches!(error, StudyError::Unwritable { .. }), "{error}");
        let reason = error.to_string();
        assert!(reason.contains("arm `whale`: evaluation 1 (after 64 training rollouts): task_means[2] is NaN"));
        assert!(reason.contains(&path.display().to_string()) && !path.exists(), "{reason}");

        whale.evaluations[1].task_means[2] = 0.0;
        whale.evaluations[0].mean.hi = f64::INFINITY;
        let (result, _) = file_of(vec![whale.clone()], &[WHALE]);
        let reason = result.write(&path).expect_err("infinite").to_string();
        assert!(reason.contains("evaluation 0 (after 0 training rollouts): mean.hi is inf"), "{reason}");

        whale.evaluations[0].mean.hi = 1.0;
        let (result, expected) = file_of(vec![whale], &[WHALE]);
        result.write(&path).expect("finite");
        assert_eq!(SeedResult::read_arm(&path, &expected, WHALE).expect("read back"), result);
    }

    #[test]
    fn the_test_split_digest_is_of_the_runs_test_tasks_wherever_their_file_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = |name: &str, answer_offset: u32| {
            let run = dir.path().join(name);
            std::fs::create_dir_all(&run).expect("run dir");
            let tasks = run.join("tasks.jsonl");
            let lines: Vec<String> = (0..8)
                .map(|i| serde_json::json!({"question": format!("{i}+1?"), "answer": format!("{}", i + 1 + answer_offset)}))
                .map(|line| line.to_string())
                .collect();
            std::fs::write(&tasks, lines.join("\n")).expect("tasks");
            let mut config = RunConfig::default();
            config.tasks.files = vec![tasks];
            (config.tasks.generate, config.tasks.train, config.tasks.search, config.tasks.test) = (0, 2, 2, 4);
            std::fs::write(run.join(CONFIG_FILE), config.to_toml().expect("toml")).expect("config");
            test_split_digest(&run).expect("a digest")
        };
        let here = run("here", 0);
        assert_eq!(here.len(), 64);
        assert_eq!(run("there", 0), here, "the same tasks in another directory");
        assert_ne!(run("other-answers", 1), here, "other gold answers");
    }
}
