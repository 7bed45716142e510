//! The data commands: check a dataset against its verifier, generate tasks, score predictions.
//!
//! Each function returns a plain report so that the CLI prints it and tests assert on it.

use serde::Serialize;
use std::io::Write;
use std::path::Path;
use whale_core::{Domain, Task};
use whale_tasks::{read_jsonl, replay_gold, task_domain, RecordError};

/// What `whale data check` found in one file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub loaded: usize,
    pub gold_solved: usize,
    pub rejected: usize,
    #[serde(skip)]
    pub problems: Vec<RecordError>,
}

/// Loads every record of `path` and replays each task's gold answer through its episode.
/// Records that fail to load and tasks whose gold answer does not verify are both rejected.
pub fn check(domain: Domain, path: &Path) -> CheckReport {
    let report = task_domain(domain).load(path);
    let mut problems = report.rejected;
    let (lines, tasks): (Vec<usize>, Vec<Task>) = report.tasks.into_iter().unzip();
    let verdicts = match replay_gold(domain, &tasks) {
        Ok(v) => v,
        Err(e) => {
            problems.push(RecordError::new(path, 0, None, e.to_string()));
            vec![]
        }
    };
    let mut gold_solved = 0;
    for ((line, task), verdict) in lines.iter().zip(&tasks).zip(&verdicts) {
        if verdict.success {
            gold_solved += 1;
        } else {
            let reason = format!("task `{}`: the gold answer does not verify: {}", task.id, verdict.detail);
            problems.push(RecordError::new(path, *line, Some(task_domain(domain).gold_field()), reason));
        }
    }
    problems.sort_by_key(|p| p.line);
    CheckReport { loaded: tasks.len(), gold_solved, rejected: problems.len(), problems }
}

/// Writes `n` generated tasks in the domain's native format.
pub fn generate(domain: Domain, n: usize, seed: u64, difficulty: u32, out: &mut dyn Write) -> std::io::Result<()> {
    let tasks = task_domain(domain);
    tasks.write_native(&tasks.generate(n, seed, difficulty), out)
}

/// One scored line of `whale score`.
#[derive(Debug, Clone, Serialize)]
pub struct ScoreLine {
    pub line: usize,
    pub id: Option<String>,
    pub reward: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub em: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub f1: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Scores every record of a JSONL file of task records carrying a `prediction` field.
/// A record that cannot be read scores 0 with its error; the others are unaffected.
pub fn score(domain: Domain, path: &Path) -> Vec<ScoreLine> {
    let (values, errors) = read_jsonl(path);
    let mut lines: Vec<ScoreLine> = errors.into_iter().map(|e| error_line(e.line, e)).collect();
    for (line, mut value) in values {
        let prediction = match take_prediction(&mut value) {
            Ok(p) => p,
            Err(reason) => {
                lines.push(error_line(line, RecordError::new(path, line, Some("prediction"), reason)));
                continue;
            }
        };
        match task_domain(domain).parse_record(&value, path, line) {
            Ok(task) => {
                let s = task_domain(domain).score(&task, &prediction);
                lines.push(ScoreLine {
                    line,
                    id: Some(task.id),
                    reward: s.verdict.reward,
                    em: s.em,
                    f1: s.f1,
                    error: None,
                });
            }
            Err(e) => lines.push(error_line(line, e)),
        }
    }
    lines.sort_by_key(|l| l.line);
    lines
}

fn error_line(line: usize, e: RecordError) -> ScoreLine {
    ScoreLine { line, id: None, reward: 0.0, em: None, f1: None, error: Some(e.to_string()) }
}

/// Removes `prediction` from a record: a string, a number, or an array of strings (moves).
fn take_prediction(value: &mut serde_json::Value) -> Result<String, String> {
    let Some(obj) = value.as_object_mut() else {
        return Err("expected a JSON object per line".into());
    };
    match obj.remove("prediction") {
        None => Err("missing; expected the model's output as a string".into()),
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(serde_json::Value::Null) => Ok(String::new()),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|m| m.as_str().map(str::to_string).ok_or("expected an array of strings"))
            .collect::<Result<Vec<_>, _>>()
            .map(|moves| moves.join(" "))
            .map_err(str::to_string),
        Some(other) => Err(format!("expected a string, got {other}")),
    }
}
