//! The report of one or more runs: test mean@k against cumulative training rollouts, one line
//! per condition with its phase boundaries marked, and a table of the best and final mean@k
//! (with bootstrap intervals), the final-minus-start gain paired over test tasks, pass@k and
//! maj@k, the spend, and the rollouts each condition needed to reach the weight-only peak.
//!
//! Everything is read back from the run directories' `metrics.jsonl` and `ledger.json`, so a
//! report can be drawn for any set of finished (or unfinished) runs; the plot is an SVG drawn
//! with `plotters` and embedded in a self-contained HTML file.

use crate::palette::PALETTE;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use whale_core::{Estimate, Ledger, Purpose, Scores};
use whale_loop::condition::Condition;
use whale_loop::metrics_row::{MetricsRow, RowKind};
use whale_loop::run_dir::{read_json, RunDir, RunDirError, CONFIG_FILE, LEDGER_FILE, REPORT_FILE, STATE_FILE};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("{}: neither a run directory nor a directory of runs", .0.display())]
    NoRuns(PathBuf),
    #[error("drawing the plot: {0}")]
    Plot(String),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// One test evaluation on a curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CurvePoint {
    pub training_rollouts: u64,
    pub mean: Estimate,
    pub pass: f64,
    pub maj: f64,
    pub k: usize,
    /// Each test task's mean reward (empty for runs from before it was recorded).
    pub task_means: Vec<f64>,
}

/// Where a phase starts, in cumulative training rollouts before it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Boundary {
    pub training_rollouts: u64,
    pub phase: String,
}

/// One run as the report sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub label: String,
    pub condition: Option<Condition>,
    pub dir: PathBuf,
    pub points: Vec<CurvePoint>,
    pub boundaries: Vec<Boundary>,
    pub ledger: Ledger,
    pub finished: bool,
}

/// The weight-phase algorithm in a run's resolved config, if it names one.
fn algorithm_of(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).ok()?;
    let table: toml::Table = text.parse().ok()?;
    Some(table.get("weights")?.get("algorithm")?.as_str()?.to_string())
}

impl Series {
    /// Reads the curve, boundaries and ledger of the run in `dir`.
    pub fn read(dir: &Path) -> Result<Self, ReportError> {
        let run = RunDir::open(dir)?;
        let state = run.read_state()?;
        let rows = MetricsRow::read_all(&run)?;
        let of_kind = |kind| rows.iter().filter(move |row| row.kind == kind).map(|row| &row.fields);
        let points = MetricsRow::evaluations::<EvaluationRow>(&rows, &run)?.into_iter().map(CurvePoint::from).collect();
        let boundaries = of_kind(RowKind::Phase)
            .map(|row| Boundary {
                training_rollouts: row["cumulative"]["training_rollouts"].as_u64().unwrap_or(0),
                phase: row["phase"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        let ledger =
            if dir.join(LEDGER_FILE).is_file() { read_json(&dir.join(LEDGER_FILE))? } else { Ledger::default() };
        let label = match algorithm_of(dir) {
            Some(algorithm) if algorithm != "rft" => format!("{}:{algorithm}", state.condition),
            _ => state.condition.to_string(),
        };
        Ok(Self {
            label,
            condition: Some(state.condition),
            dir: dir.to_path_buf(),
            points,
            boundaries,
            ledger,
            finished: state.finished,
        })
    }

    /// The best point (highest mean, earliest among equals) and the last one.
    pub fn best_and_final(&self) -> Option<(&CurvePoint, &CurvePoint)> {
        let last = self.points.last()?;
        let best = self.points.iter().fold(&self.points[0], |b, p| if p.mean.value > b.mean.value { p } else { b });
        Some((best, last))
    }

    /// The training rollouts spent when the curve first reached `target`.
    pub fn rollouts_to_reach(&self, target: f64) -> Option<u64> {
        self.points.iter().find(|p| p.mean.value >= target - 1e-12).map(|p| p.training_rollouts)
    }
}

/// What the curve reads of an evaluation row of `metrics.jsonl`.
#[derive(Deserialize)]
struct EvaluationRow {
    cumulative: Cumulative,
    scores: Scores,
    /// Absent in runs from before it was recorded.
    #[serde(default)]
    task_means: Vec<f64>,
}

#[derive(Deserialize)]
struct Cumulative {
    training_rollouts: u64,
}

impl From<EvaluationRow> for CurvePoint {
    fn from(row: EvaluationRow) -> Self {
        CurvePoint {
            training_rollouts: row.cumulative.training_rollouts,
            mean: row.scores.mean,
            pass: row.scores.pass.value,
            maj: row.scores.maj.value,
            k: row.scores.k,
            task_means: row.task_means,
        }
    }
}

/// The mean of `after - before` over the same test tasks with its 95% bootstrap interval
/// (tasks resampled, each keeping its pair); `None` unless both list every task.
pub fn paired_gain(before: &CurvePoint, after: &CurvePoint) -> Option<Estimate> {
    let differences = task_differences(&before.task_means, &after.task_means)?;
    Some(whale_core::metrics::bootstrap_mean(&differences, 1000, 0x9A1D))
}

/// `after - before` task by task; `None` unless both list the same, non-zero number of tasks.
pub fn task_differences(before: &[f64], after: &[f64]) -> Option<Vec<f64>> {
    (!before.is_empty() && before.len() == after.len()).then(|| before.iter().zip(after).map(|(b, a)| a - b).collect())
}

/// Where a run named `name` comes among a comparison's: the conditions in their order, then
/// every other name (an arm with its own algorithm, `weight-only-grpo`) in name order.
pub fn run_order(name: &str) -> (usize, String) {
    let rank = Condition::ALL.iter().position(|c| c.as_str() == name).unwrap_or(usize::MAX);
    (rank, name.to_string())
}

/// The run directories under `path`: itself if it is one, else its subdirectories that are
/// (in [`run_order`]).
pub fn run_dirs(path: &Path) -> Result<Vec<PathBuf>, ReportError> {
    if path.join(STATE_FILE).is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|source| ReportError::Io { path: path.to_path_buf(), source })?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join(STATE_FILE).is_file() && p.join(CONFIG_FILE).is_file())
        .collect();
    dirs.sort_by_key(|p| (run_order(p.file_name().and_then(|n| n.to_str()).unwrap_or_default()), p.clone()));
    if dirs.is_empty() {
        return Err(ReportError::NoRuns(path.to_path_buf()));
    }
    Ok(dirs)
}

/// One row of the comparison table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparisonRow {
    pub label: String,
    pub best: Option<CurvePoint>,
    pub last: Option<CurvePoint>,
    pub training_rollouts: u64,
    pub test_rollouts: u64,
    /// Training rollouts spent when the curve first reached the weight-only peak (`None`: never).
    pub to_weight_only_peak: Option<u64>,
    /// Final minus start mean@k, paired over test tasks ([`paired_gain`]).
    pub gain: Option<Estimate>,
}

/// The comparison of `series`; the weight-only peak comes from the weight-only run, if any.
pub fn comparison(series: &[Series]) -> Vec<ComparisonRow> {
    let peak = series
        .iter()
        .find(|s| s.condition == Some(Condition::WeightOnly))
        .and_then(|s| s.best_and_final())
        .map(|(best, _)| best.mean.value);
    series
        .iter()
        .map(|s| {
            let (best, last) = s.best_and_final().map_or((None, None), |(b, l)| (Some(b.clone()), Some(l.clone())));
            ComparisonRow {
                label: s.label.clone(),
                best,
                last,
                training_rollouts: s.ledger.training_rollouts(),
                test_rollouts: s.ledger.get(Purpose::TestEval).rollouts,
                to_weight_only_peak: peak.and_then(|p| s.rollouts_to_reach(p)),
                gain: s.points.first().zip(s.points.last()).and_then(|(start, end)| paired_gain(start, end)),
            }
        })
        .collect()
}

/// The comparison as a plain-text table.
pub fn table_text(rows: &[ComparisonRow]) -> String {
    let k = rows.iter().find_map(|r| r.last.as_ref().map(|p| p.k)).unwrap_or(8);
    let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(0).max(15);
    let mut out = format!(
        "{:<width$} {:>24} {:>24} {:>26} {:>8} {:>8} {:>9} {:>13}\n",
        "condition",
        format!("best mean@{k} [95% CI]"),
        format!("final mean@{k} [95% CI]"),
        "final - start [paired CI]",
        format!("pass@{k}"),
        format!("maj@{k}"),
        "rollouts",
        "to WO peak"
    );
    for row in rows {
        let estimate = |p: &Option<CurvePoint>| p.as_ref().map_or("-".to_string(), |p| p.mean.to_string());
        let last = row.last.as_ref();
        let _ = writeln!(
            out,
            "{:<width$} {:>24} {:>24} {:>26} {:>8} {:>8} {:>9} {:>13}",
            row.label,
            estimate(&row.best),
            estimate(&row.last),
            gain_text(row.gain),
            last.map_or("-".to_string(), |p| format!("{:.3}", p.pass)),
            last.map_or("-".to_string(), |p| format!("{:.3}", p.maj)),
            row.training_rollouts,
            row.to_weight_only_peak.map_or("not reached".to_string(), |r| r.to_string()),
        );
    }
    out
}

/// A paired gain as `+0.031 [+0.008, +0.055]`, or `-` when it cannot be paired.
fn gain_text(gain: Option<Estimate>) -> String {
    gain.map_or("-".to_string(), |g| format!("{:+.3} [{:+.3}, {:+.3}]", g.value, g.lo, g.hi))
}

/// Test mean@k against cumulative training rollouts, one line per series with its 95%
/// interval as whiskers and its phase boundaries as thin vertical ticks.
pub fn plot_svg(series: &[Series]) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 520)).into_drawing_area();
        draw(&root, series).map_err(|e| ReportError::Plot(e.to_string()))?;
        root.present().map_err(|e| ReportError::Plot(e.to_string()))?;
    }
    Ok(svg)
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, plotters::coord::Shift>, series: &[Series]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let max_x = series.iter().flat_map(|s| s.points.iter().map(|p| p.training_rollouts)).max().unwrap_or(1).max(1);
    let max_y = series.iter().flat_map(|s| s.points.iter().map(|p| p.mean.hi)).fold(0.0_f64, f64::max);
    let min_y = series.iter().flat_map(|s| s.points.iter().map(|p| p.mean.lo)).fold(1.0_f64, f64::min);
    let y_top = (max_y + 0.05).clamp(0.05, 1.0);
    let y_bottom = (min_y - 0.05).clamp(0.0, y_top - 0.05);
    let k = series.iter().find_map(|s| s.points.first().map(|p| p.k)).unwrap_or(8);
    let mut chart = ChartBuilder::on(root)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..max_x as f64 * 1.02, y_bottom..y_top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .x_desc("cumulative training rollouts (weight phase + search)")
        .y_desc(format!("test mean@{k}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, s) in series.iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        // Earlier series are drawn wider, so a later one on the same points leaves them visible.
        let width = 2 + (series.len() - 1 - index) as u32 / 2;
        for boundary in &s.boundaries {
            let x = boundary.training_rollouts as f64;
            let tick = vec![(x, y_bottom), (x, y_bottom + (y_top - y_bottom) * 0.04)];
            chart.draw_series(LineSeries::new(tick, color.stroke_width(2))).map_err(|e| e.to_string())?;
            let faint = vec![(x, y_bottom), (x, y_top)];
            chart.draw_series(LineSeries::new(faint, color.mix(0.15))).map_err(|e| e.to_string())?;
        }
        let line: Vec<(f64, f64)> = s.points.iter().map(|p| (p.training_rollouts as f64, p.mean.value)).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(width)))
            .map_err(|e| e.to_string())?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width)));
        chart
            .draw_series(line.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))
            .map_err(|e| e.to_string())?;
        for p in &s.points {
            let x = p.training_rollouts as f64;
            chart
                .draw_series(LineSeries::new(vec![(x, p.mean.lo), (x, p.mean.hi)], color.mix(0.5)))
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The whole report as a self-contained HTML page.
pub fn html(title: &str, series: &[Series]) -> Result<String, ReportError> {
    let svg = plot_svg(series)?;
    let rows = comparison(series);
    let k = rows.iter().find_map(|r| r.last.as_ref().map(|p| p.k)).unwrap_or(8);
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>\n<style>\
         body{{font-family:sans-serif;margin:2em;max-width:1000px}} table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child,th:first-child{{text-align:left}}\
         </style></head><body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
    let _ = write!(
        out,
        "<p>Test mean@{k} against the cumulative training rollouts (weight phase plus search; test-evaluation \
         rollouts are not counted). Whiskers: 95% bootstrap intervals over test tasks. Ticks on the x axis: \
         the start of each phase.</p>\n{svg}\n"
    );
    out.push_str(&comparison_table_html(&rows, k));
    out.push_str(&spend_table_html(series));
    out.push_str("</body></html>\n");
    Ok(out)
}

fn comparison_table_html(rows: &[ComparisonRow], k: usize) -> String {
    let mut out = format!(
        "<h2>Best and final</h2>\n<table><tr><th>condition</th><th>best mean@{k} [95% CI]</th><th>at rollouts</th>\
         <th>final mean@{k} [95% CI]</th><th>final - start [95% CI, paired over tasks]</th>\
         <th>final pass@{k}</th><th>final maj@{k}</th>\
         <th>training rollouts</th><th>rollouts to reach the weight-only peak</th></tr>\n"
    );
    for row in rows {
        let cell = |p: &Option<CurvePoint>| p.as_ref().map_or("-".to_string(), |p| p.mean.to_string());
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&row.label),
            cell(&row.best),
            row.best.as_ref().map_or("-".to_string(), |p| p.training_rollouts.to_string()),
            cell(&row.last),
            gain_text(row.gain),
            row.last.as_ref().map_or("-".to_string(), |p| format!("{:.3}", p.pass)),
            row.last.as_ref().map_or("-".to_string(), |p| format!("{:.3}", p.maj)),
            row.training_rollouts,
            row.to_weight_only_peak.map_or("not reached".to_string(), |r| r.to_string()),
        );
    }
    out.push_str("</table>\n");
    out
}

fn spend_table_html(series: &[Series]) -> String {
    let mut out = "<h2>Spend</h2>\n<table><tr><th>condition</th><th>weight-phase rollouts</th><th>search rollouts</th>\
                   <th>test rollouts</th><th>tokens</th><th>proposer tokens</th><th>wall time (s)</th><th>run</th></tr>\n"
        .to_string();
    for s in series {
        let l = &s.ledger;
        let tokens: u64 = l.by_purpose.values().map(|x| x.prompt_tokens + x.completion_tokens).sum();
        let wall: f64 = l.by_purpose.values().map(|x| x.wall_s).sum();
        let proposer = l.get(Purpose::Proposer);
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{tokens}</td><td>{}</td><td>{wall:.0}</td><td>{}{}</td></tr>",
            escape(&s.label),
            l.get(Purpose::WeightPhase).rollouts,
            l.get(Purpose::Search).rollouts,
            l.get(Purpose::TestEval).rollouts,
            proposer.prompt_tokens + proposer.completion_tokens,
            escape(&s.dir.display().to_string()),
            if s.finished { "" } else { " (unfinished)" },
        );
    }
    out.push_str("</table>\n");
    out
}

/// Writes the report of the runs in `dirs` (run directories or directories of runs) to `out`.
pub fn write_report(dirs: &[PathBuf], out: &Path, title: &str) -> Result<Vec<Series>, ReportError> {
    let mut series = Vec::new();
    for dir in dirs {
        for run in run_dirs(dir)? {
            series.push(Series::read(&run)?);
        }
    }
    name_repeated_labels(&mut series);
    let page = html(title, &series)?;
    std::fs::write(out, page).map_err(|source| ReportError::Io { path: out.to_path_buf(), source })?;
    Ok(series)
}

/// Adds its directory to each label that more than one series carries (two harness-only runs
/// with different proposers, or one arm of two comparisons), as the shortest ending of its path
/// that no other such series shares, so that the table's rows and the plot's lines differ.
pub fn name_repeated_labels(series: &mut [Series]) {
    let labels: Vec<String> = series.iter().map(|s| s.label.clone()).collect();
    let paths: Vec<Vec<String>> = series
        .iter()
        .map(|s| s.dir.components().rev().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect())
        .collect();
    for (i, s) in series.iter_mut().enumerate() {
        let rivals: Vec<&Vec<String>> =
            (0..labels.len()).filter(|&j| j != i && labels[j] == labels[i]).map(|j| &paths[j]).collect();
        if rivals.is_empty() {
            continue;
        }
        let depth = (1..=paths[i].len())
            .find(|&k| rivals.iter().all(|other| other.iter().take(k).ne(paths[i].iter().take(k))))
            .unwrap_or(paths[i].len());
        let ending: Vec<&str> = paths[i].iter().take(depth).rev().map(String::as_str).collect();
        s.label = format!("{} ({})", s.label, ending.join("/"));
    }
}

/// Writes `report.html` of the run in `dir` into it. A finished run's directory holds its report:
/// whoever runs an experiment to the end writes it (`whale run`, [`crate::compare`]) while it
/// still holds the experiment, and so the directory's lock.
pub fn write_run_report(dir: &Path) -> Result<PathBuf, ReportError> {
    let out = dir.join(REPORT_FILE);
    let series = Series::read(dir)?;
    let page = html(&format!("whale run: {}", series.label), &[series])?;
    std::fs::write(&out, page).map_err(|source| ReportError::Io { path: out.clone(), source })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use whale_loop::run_dir::METRICS_FILE;

    fn point(rollouts: u64, mean: f64) -> CurvePoint {
        CurvePoint {
            training_rollouts: rollouts,
            mean: Estimate { value: mean, lo: mean - 0.05, hi: mean + 0.05 },
            pass: mean,
            maj: mean,
            k: 8,
            task_means: Vec::new(),
        }
    }

    fn series(condition: Condition, points: Vec<CurvePoint>) -> Series {
        Series {
            label: condition.to_string(),
            condition: Some(condition),
            dir: PathBuf::from(condition.as_str()),
            points,
            boundaries: vec![Boundary { training_rollouts: 64, phase: "search".into() }],
            ledger: Ledger::default(),
            finished: true,
        }
    }

    #[test]
    fn the_table_measures_every_condition_against_the_weight_only_peak() {
        let all = [
            series(Condition::WeightOnly, vec![point(0, 0.2), point(100, 0.4), point(200, 0.35)]),
            series(Condition::Whale, vec![point(0, 0.2), point(150, 0.45), point(300, 0.5)]),
            series(Condition::HarnessOnly, vec![point(0, 0.2), point(300, 0.3)]),
        ];
        let rows = comparison(&all);
        assert_eq!(rows[0].to_weight_only_peak, Some(100));
        assert_eq!(rows[1].to_weight_only_peak, Some(150));
        assert_eq!(rows[2].to_weight_only_peak, None);
        assert_eq!(rows[0].best.as_ref().map(|p| p.training_rollouts), Some(100));
        assert_eq!(rows[0].last.as_ref().map(|p| p.mean.value), Some(0.35));
        let text = table_text(&rows);
        assert!(text.contains("not reached") && text.contains("weight-only"), "{text}");
    }

    #[test]
    fn the_gain_is_paired_over_the_same_tasks() {
        let with = |mean: f64, task_means: Vec<f64>| CurvePoint { task_means, ..point(0, mean) };
        let start = with(0.5, vec![0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.5, 0.5]);
        let shifted = with(0.6, start.task_means.iter().map(|m| m + 0.1).collect());
        let gain = paired_gain(&start, &shifted).expect("paired");
        assert!((gain.value - 0.1).abs() < 1e-12 && (gain.lo - 0.1).abs() < 1e-12, "{gain:?}: every pair moved 0.1");
        let mixed = with(0.5, vec![1.0, 0.25, 0.5, 0.75, 0.0, 0.5, 0.5, 0.5]);
        let gain = paired_gain(&start, &mixed).expect("paired");
        assert!(gain.value.abs() < 1e-12 && gain.lo < 0.0 && gain.hi > 0.0, "{gain:?}");
        assert_eq!(paired_gain(&start, &point(0, 0.5)), None, "no per-task means, no pairing");
        let mut all = [series(Condition::WeightOnly, vec![start, shifted])];
        let rows = comparison(&all);
        assert!(table_text(&rows).contains("+0.100 [+0.100, +0.100]"), "{}", table_text(&rows));
        all[0].points.truncate(1);
        assert!(comparison(&all)[0].gain.is_some_and(|g| g.value == 0.0), "a one-point curve gains nothing");
    }

    /// An evaluation row as a run writes it (the fields the curve reads).
    fn evaluation_row(rollouts: u64, mean: f64) -> Value {
        let estimate = serde_json::json!({"value": mean, "lo": mean - 0.1, "hi": mean + 0.1});
        serde_json::json!({
            "kind": "evaluation",
            "reason": "periodic",
            "cumulative": {"training_rollouts": rollouts},
            "scores": {"tasks": 2, "k": 4, "mean": estimate, "pass": estimate, "maj": estimate},
            "task_means": [mean, mean],
        })
    }

    #[test]
    fn an_evaluation_row_that_does_not_read_is_an_error_naming_the_file_and_the_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = RunDir::create(dir.path()).expect("run dir");
        run.commit(&whale_loop::run_dir::RunState::new(Condition::WeightOnly)).expect("state");
        let phase = serde_json::json!({"kind": "phase", "phase": "weights", "cumulative": {"training_rollouts": 0}});
        run.append_metrics(&[evaluation_row(0, 0.25), phase, evaluation_row(8, 0.5)]).expect("rows");
        let series = Series::read(dir.path()).expect("a run whose rows all read");
        let curve: Vec<(u64, f64)> = series.points.iter().map(|p| (p.training_rollouts, p.mean.value)).collect();
        assert_eq!(curve, [(0, 0.25), (8, 0.5)]);
        assert_eq!(series.points[1].task_means, [0.5, 0.5]);
        let mut corrupt = evaluation_row(16, 0.75);
        corrupt["scores"]["mean"] = serde_json::json!("0.75");
        run.append_metrics(&[corrupt, evaluation_row(24, 0.8)]).expect("rows");
        let error = Series::read(dir.path()).expect_err("a corrupt evaluation row").to_string();
        for part in [METRICS_FILE, "row 4", "an evaluation row", "invalid type"] {
            assert!(error.contains(part), "`{error}` does not name {part}");
        }
        assert!(matches!(write_run_report(dir.path()), Err(ReportError::RunDir(RunDirError::Corrupt { .. }))));
        assert!(!dir.path().join(REPORT_FILE).exists(), "no report of a curve missing a point");
    }

    #[test]
    fn the_html_embeds_one_line_per_condition_and_the_tables() {
        let all = [
            series(Condition::WeightOnly, vec![point(0, 0.2), point(100, 0.4)]),
            series(Condition::Whale, vec![point(0, 0.2), point(100, 0.5)]),
        ];
        let page = html("demo", &all).expect("html");
        assert!(page.contains("<svg"), "an inline SVG plot");
        assert_eq!(page.matches("<tr><td>whale</td>").count(), 2, "a row in both tables");
        assert!(page.contains("test mean@8"));
    }

    #[test]
    fn runs_of_one_condition_are_told_apart_by_their_directories() {
        let mut all = [
            series(Condition::HarnessOnly, vec![point(0, 0.1)]),
            series(Condition::HarnessOnly, vec![point(0, 0.1)]),
            series(Condition::Whale, vec![point(0, 0.1)]),
        ];
        all[0].dir = PathBuf::from("runs/one-shot-s0");
        all[1].dir = PathBuf::from("runs/mutate-s0");
        name_repeated_labels(&mut all);
        let labels: Vec<&str> = all.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["harness-only (one-shot-s0)", "harness-only (mutate-s0)", "whale"]);
        let mut arms = [series(Condition::Whale, vec![point(0, 0.1)]), series(Condition::Whale, vec![point(0, 0.1)])];
        arms[0].dir = PathBuf::from("runs/seed-0/whale");
        arms[1].dir = PathBuf::from("runs/seed-1/whale");
        name_repeated_labels(&mut arms);
        assert_eq!(
            arms.map(|s| s.label),
            ["whale (seed-0/whale)", "whale (seed-1/whale)"],
            "one arm of two comparisons"
        );
    }
}
