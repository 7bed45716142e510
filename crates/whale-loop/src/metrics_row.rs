//! The rows of `metrics.jsonl`, each named by its `kind` field. The run writes the kind from
//! [`RowKind`] and the report and the run's outcome read it back through it, so a row of a kind
//! this build does not know is an error that names the file, the field and the value, never a
//! row silently left out of a curve.

use crate::run_dir::{RunDir, RunDirError, METRICS_FILE};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a row records; on disk its snake_case name (`"weight_step"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// A test evaluation: its scores, its reason and the tasks' means.
    Evaluation,
    /// A weight step: the step's report.
    WeightStep,
    /// The first unit of a search phase: the incumbent re-scored under the current weights.
    Rescore,
    /// A search iteration: the incumbent's objectives and whether a new best was accepted.
    SearchIteration,
    /// The start of a phase, with the cumulative spend from before its first unit.
    Phase,
}

/// One committed row: its kind, and every field as written (the kind included).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsRow {
    pub kind: RowKind,
    pub fields: Value,
}

impl MetricsRow {
    /// The committed rows of the run's `metrics.jsonl`, in order.
    pub fn read_all(run: &RunDir) -> Result<Vec<MetricsRow>, RunDirError> {
        run.metrics()?
            .into_iter()
            .enumerate()
            .map(|(index, fields)| {
                let kind = RowKind::deserialize(&fields["kind"]).map_err(|e| RunDirError::Corrupt {
                    path: run.path(METRICS_FILE),
                    reason: format!("row {}: field `kind`: {e}", index + 1),
                })?;
                Ok(MetricsRow { kind, fields })
            })
            .collect()
    }

    /// The run's evaluation rows, each read as `T` (the fields its reader needs).
    pub fn read_evaluations<T: DeserializeOwned>(run: &RunDir) -> Result<Vec<T>, RunDirError> {
        Self::evaluations(&Self::read_all(run)?, run)
    }

    /// The evaluation rows among `rows` (the run's, as [`Self::read_all`] read them) as `T`. A
    /// row that does not read is a corrupt run directory naming the file and the row, never an
    /// evaluation silently left out of a curve or a study.
    pub fn evaluations<T: DeserializeOwned>(rows: &[MetricsRow], run: &RunDir) -> Result<Vec<T>, RunDirError> {
        rows.iter()
            .enumerate()
            .filter(|(_, row)| row.kind == RowKind::Evaluation)
            .map(|(index, row)| {
                T::deserialize(&row.fields).map_err(|e| RunDirError::Corrupt {
                    path: run.path(METRICS_FILE),
                    reason: format!("row {}: an evaluation row: {e}", index + 1),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SPELLINGS: [(RowKind, &str); 5] = [
        (RowKind::Evaluation, "evaluation"),
        (RowKind::WeightStep, "weight_step"),
        (RowKind::Rescore, "rescore"),
        (RowKind::SearchIteration, "search_iteration"),
        (RowKind::Phase, "phase"),
    ];

    /// Runs written before the kinds were typed hold these names; they must read the same.
    #[test]
    fn every_kind_is_written_and_read_as_the_name_existing_runs_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        let rows: Vec<Value> = SPELLINGS.iter().map(|(kind, _)| json!({"kind": kind, "unit": 1})).collect();
        run.append_metrics(&rows).expect("append");
        let text = std::fs::read_to_string(dir.path().join(METRICS_FILE)).expect("metrics");
        let written: Vec<String> =
            SPELLINGS.iter().map(|(_, name)| format!("{{\"kind\":\"{name}\",\"unit\":1}}\n")).collect();
        assert_eq!(text, written.concat());
        let kinds: Vec<RowKind> = MetricsRow::read_all(&run).expect("rows").iter().map(|row| row.kind).collect();
        assert_eq!(kinds, SPELLINGS.map(|(kind, _)| kind));
    }

    #[test]
    fn a_row_of_an_unknown_kind_is_an_error_naming_the_row_the_field_and_the_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        run.append_metrics(&[json!({"kind": "evaluation"}), json!({"kind": "weight_update"})]).expect("append");
        let error = MetricsRow::read_all(&run).expect_err("an unknown kind").to_string();
        for part in ["metrics.jsonl", "row 2", "field `kind`", "weight_update"] {
            assert!(error.contains(part), "`{error}` does not name {part}");
        }
    }
}
