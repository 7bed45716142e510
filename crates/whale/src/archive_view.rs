//! `whale archive`: reading a run's harness archive — the Pareto frontier, the top candidates,
//! the difference between two candidates' sources, a candidate's raw traces, and the
//! proposers' record beside the proposer's spend from the run's ledger.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use whale_core::{Ledger, Purpose, Trajectory};
use whale_loop::search_phase::ranking;
use whale_search::{Archive, ArchiveError, Candidate, ProposalRecord, SummaryEvent};

#[derive(Debug, thiserror::Error)]
pub enum ArchiveViewError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{}: no archive there (expected a run directory or its archive/)", .0.display())]
    NotFound(PathBuf),
    #[error("no candidate `{0}` (ids look like c0003; see `whale archive DIR top`)")]
    UnknownCandidate(String),
    #[error("nothing was scored under weights version {0}")]
    NoScores(u64),
    #[error("{}: {message}", path.display())]
    Ledger { path: PathBuf, message: String },
}

/// Opens the archive of a run directory, or an archive directory itself.
pub fn open(path: &Path) -> Result<Archive, ArchiveViewError> {
    let dir =
        if path.join("archive").join("summary.jsonl").is_file() { path.join("archive") } else { path.to_path_buf() };
    if !dir.join("summary.jsonl").is_file() {
        return Err(ArchiveViewError::NotFound(path.to_path_buf()));
    }
    Ok(Archive::open(dir)?)
}

/// The weights version of the archive's latest scoring.
pub fn latest_version(archive: &Archive) -> u64 {
    archive
        .events()
        .iter()
        .rev()
        .find_map(|e| match e {
            SummaryEvent::Rescored { weights_version, .. }
            | SummaryEvent::Scored { weights_version, .. }
            | SummaryEvent::Concluded { weights_version, .. } => Some(*weights_version),
            _ => None,
        })
        .unwrap_or(0)
}

/// The frontier under `version` as text.
pub fn frontier_text(archive: &Archive, version: u64) -> Result<String, ArchiveViewError> {
    let frontier = archive.frontier(version)?;
    if frontier.front.is_empty() {
        return Err(ArchiveViewError::NoScores(version));
    }
    let mut out = format!("weights version {version}; incumbent {}\n", frontier.incumbent.id);
    let _ = writeln!(out, "{:<24} {:>8} {:>8} {:>9}", "candidates", "success", "turns", "tokens");
    for entry in &frontier.front {
        let o = entry.objectives;
        let _ = writeln!(
            out,
            "{:<24} {:>8.3} {:>8.2} {:>9.1}",
            entry.ids.join(","),
            o.success,
            o.mean_turns,
            o.mean_tokens
        );
    }
    Ok(out)
}

/// The best `k` candidates under `version` as text.
pub fn top_text(archive: &Archive, version: u64, k: usize) -> Result<String, ArchiveViewError> {
    let ranked = ranking(archive, version)?;
    if ranked.is_empty() {
        return Err(ArchiveViewError::NoScores(version));
    }
    let mut out = format!("weights version {version}\n");
    let _ = writeln!(out, "{:<6} {:>8} {:>8} {:>9}  hypothesis", "id", "success", "turns", "tokens");
    for r in ranked.iter().take(k) {
        let o = r.objectives;
        let hypothesis: String = r.hypothesis.chars().take(90).collect();
        let _ =
            writeln!(out, "{:<6} {:>8.3} {:>8.2} {:>9.1}  {hypothesis}", r.id, o.success, o.mean_turns, o.mean_tokens);
    }
    Ok(out)
}

fn candidate<'a>(archive: &'a Archive, id: &str) -> Result<&'a Candidate, ArchiveViewError> {
    archive.candidate(id).ok_or_else(|| ArchiveViewError::UnknownCandidate(id.to_string()))
}

/// A line diff of two candidates' sources (`-` only in `a`, `+` only in `b`), with 2 lines
/// of context around each change.
pub fn diff_text(archive: &Archive, a: &str, b: &str) -> Result<String, ArchiveViewError> {
    let (left, right) = (candidate(archive, a)?, candidate(archive, b)?);
    let mut out = format!("--- {a} ({})\n+++ {b} ({})\n", &left.meta.hash[..12], &right.meta.hash[..12]);
    out.push_str(&line_diff(&left.source, &right.source, 2));
    Ok(out)
}

/// A longest-common-subsequence line diff with `context` unchanged lines around changes.
pub fn line_diff(a: &str, b: &str, context: usize) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near_change =
        |k: usize| ops[k.saturating_sub(context)..(k + context + 1).min(ops.len())].iter().any(|(op, _)| *op != ' ');
    let mut out = String::new();
    let mut skipped = false;
    for (k, (op, line)) in ops.iter().enumerate() {
        if *op == ' ' && !near_change(k) {
            skipped = true;
            continue;
        }
        if skipped {
            out.push_str("@@\n");
            skipped = false;
        }
        let _ = writeln!(out, "{op}{line}");
    }
    out
}

/// The traces of candidate `id` under `version` (failed rollouts only when `failed_only`).
pub fn traces(
    archive: &Archive,
    id: &str,
    version: u64,
    failed_only: bool,
) -> Result<Vec<Trajectory>, ArchiveViewError> {
    let candidate = candidate(archive, id)?;
    let traces = archive.traces(&candidate.meta.hash, version)?;
    Ok(traces.into_iter().filter(|t| !failed_only || !t.success).collect())
}

/// One line per trace: task, reward, answer, and the error or the verifier's reason.
pub fn traces_text(traces: &[Trajectory]) -> String {
    let mut out = String::new();
    for t in traces {
        let answer = t.answer.as_ref().map_or("-".to_string(), |a| a.to_string());
        let answer: String = answer.chars().take(40).collect();
        let why = t.error.as_ref().map_or(t.verdict_detail.clone(), |e| format!("{:?}: {}", e.kind, e.message));
        let why: String = why.chars().take(80).collect();
        let _ = writeln!(out, "{:<28} reward {:.2} turns {} answer {answer} | {why}", t.task_id, t.reward, t.turns);
    }
    out
}

/// The proposers' record ([`ProposalRecord`]) and, from the ledger of the run that `path`
/// names (a run directory or its archive/), the proposer's requests' tokens and wall time.
pub fn proposals_text(archive: &Archive, path: &Path) -> Result<String, ArchiveViewError> {
    let mut out = ProposalRecord::from_events(archive.events()).to_string();
    let ledger = [path.join("ledger.json"), path.join("..").join("ledger.json")].into_iter().find(|p| p.is_file());
    let Some(ledger_path) = ledger else {
        out.push_str("proposer spend: unknown (no run ledger.json beside the archive)\n");
        return Ok(out);
    };
    let error = |message: String| ArchiveViewError::Ledger { path: ledger_path.clone(), message };
    let text = std::fs::read_to_string(&ledger_path).map_err(|e| error(e.to_string()))?;
    let ledger: Ledger = serde_json::from_str(&text).map_err(|e| error(e.to_string()))?;
    let spend = ledger.get(Purpose::Proposer);
    let _ = writeln!(
        out,
        "proposer spend: {} prompt and {} completion tokens, {:.0} s",
        spend.prompt_tokens, spend.completion_tokens, spend.wall_s
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_marks_changed_lines_and_keeps_context() {
        let a = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n";
        let b = "one\ntwo\nthree\nFOUR\nfive\nsix\nseven\neight\n";
        let diff = line_diff(a, b, 1);
        assert_eq!(diff, "@@\n three\n-four\n+FOUR\n five\n@@\n seven\n+eight\n");
        assert_eq!(line_diff(a, a, 2), "");
    }
}
