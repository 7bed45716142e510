//! A domain behind one trait: what whale does with its tasks, and what the layers above need
//! to know of it.
//!
//! Each domain folder (math/, chess/, qa/) implements [`TaskDomain`]: its files, its generator,
//! its verifier and its environment, and the facts other crates would otherwise match on the
//! domain for: the answer key majority voting compares, whether its scores carry EM and F1,
//! whether it searches a corpus, which bottleneck the study tests for it. The registry that
//! maps a [`Domain`] to its implementation is [`crate::registry`].

use crate::{Environment, EnvironmentError, LoadReport, RecordError};
use std::io::Write;
use std::path::Path;
use whale_core::{Domain, Task, Verdict};

/// The score of one prediction; QA adds exact match and F1.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictionScore {
    pub verdict: Verdict,
    pub em: Option<f64>,
    pub f1: Option<f64>,
}

/// What the paper claims limits a domain's gains, and so which measurement the study's
/// bottleneck finding reads for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bottleneck {
    /// Harness search reaches the weight-only peak with fewer rollouts than weight updates
    /// (search QA): the study reads the rollouts each arm needs to reach that peak.
    Harness,
    /// Harness gains appear only after weight updates (math): the study reads the coupling
    /// matrix's interaction of the last harness with the last weights.
    Weights,
    /// The paper states none (chess): the study reports both measurements without a verdict.
    Unstated,
}

/// Where a domain that searches a corpus finds it. Both absent: the tasks' own passages,
/// indexed in memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct CorpusSource<'a> {
    /// A corpus file, one passage per line, instead of the tasks' own passages.
    pub file: Option<&'a Path>,
    /// A directory that keeps the search index between runs.
    pub index_dir: Option<&'a Path>,
}

/// One domain: everything whale does with its tasks, and what the layers above ask of it.
pub trait TaskDomain: Sync {
    /// The identifier this domain is registered and serialized under.
    fn domain(&self) -> Domain;
    /// Load every record of a file in any form the domain accepts.
    fn load(&self, path: &Path) -> LoadReport;
    /// Parse one JSON record (any accepted form).
    fn parse_record(&self, value: &serde_json::Value, file: &Path, line: usize) -> Result<Task, RecordError>;
    /// `n` synthetic tasks, deterministic for `seed`.
    fn generate(&self, n: usize, seed: u64, difficulty: u32) -> Vec<Task>;
    /// Write tasks in the domain's native file format (JSONL; Lichess CSV for chess).
    fn write_native(&self, tasks: &[Task], out: &mut dyn Write) -> std::io::Result<()>;
    /// The native file extension (`jsonl`, `csv`).
    fn native_extension(&self) -> &'static str;
    /// The record field of a data file that holds the gold answer, named in its errors.
    fn gold_field(&self) -> &'static str;
    /// The task as a harness may see it: no gold answer, no solution.
    fn public_view(&self, task: &Task) -> serde_json::Value;
    /// The actions that solve the task when played in order (empty for a malformed task).
    fn gold_actions(&self, task: &Task) -> Vec<String>;
    /// Score a prediction made anywhere (model text, a move list, an answer string).
    fn score(&self, task: &Task, prediction: &str) -> PredictionScore;
    /// Whether [`score`](TaskDomain::score) reports exact match and F1 besides the verdict,
    /// so that summaries of many scores print their means.
    fn scores_em_f1(&self) -> bool;
    /// A rollout's answer in a form where equal answers are equal strings, for majority
    /// voting (maj@k); empty when there is no answer to vote for.
    fn answer_key(&self, answer: &serde_json::Value) -> String;
    /// Whether the episodes search a corpus, so that a run may name a corpus file and an
    /// index directory.
    fn searches_a_corpus(&self) -> bool;
    /// The environment for a run over `tasks`, searching `corpus` where the domain searches one.
    fn environment(&self, tasks: &[Task], corpus: CorpusSource<'_>) -> Result<Environment, EnvironmentError>;
    /// Which bottleneck the study tests for this domain.
    fn bottleneck(&self) -> Bottleneck;
}

/// The trait methods a domain answers with its folder's free functions of the same names
/// (`load`, `parse_record`, `generate`, `write_native`, `public_view`, `gold_actions`), which
/// tests and other crates also call. Invoked inside each domain's `impl TaskDomain`, so the
/// three domains do not each spell out the same forwarding.
macro_rules! folder_functions {
    () => {
        fn load(&self, path: &::std::path::Path) -> $crate::LoadReport {
            super::load(path)
        }

        fn parse_record(
            &self,
            value: &::serde_json::Value,
            file: &::std::path::Path,
            line: usize,
        ) -> ::std::result::Result<::whale_core::Task, $crate::RecordError> {
            super::parse_record(value, file, line)
        }

        fn generate(&self, n: usize, seed: u64, difficulty: u32) -> ::std::vec::Vec<::whale_core::Task> {
            super::generate(n, seed, difficulty)
        }

        fn write_native(&self, tasks: &[::whale_core::Task], out: &mut dyn ::std::io::Write) -> ::std::io::Result<()> {
            super::write_native(tasks, out)
        }

        fn public_view(&self, task: &::whale_core::Task) -> ::serde_json::Value {
            super::public_view(task)
        }

        fn gold_actions(&self, task: &::whale_core::Task) -> ::std::vec::Vec<::std::string::String> {
            super::gold_actions(task)
        }
    };
}
pub(crate) use folder_functions;
