//! `whale data bench`: verifier throughput per domain and BM25 index speed on real data.
//!
//! Numbers are measured in one run on this machine and printed as a table; nothing here is
//! a timed test.

use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;
use whale_core::{Domain, Task};
use whale_tasks::{qa, replay_gold, task_domain};

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub what: String,
    pub items: usize,
    pub seconds: f64,
    pub unit: &'static str,
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    pub rows: Vec<Row>,
}

impl Table {
    pub fn print(&self) {
        println!("{:<50} {:>8} {:>10} {:>14}", "benchmark", "items", "seconds", "throughput");
        for r in &self.rows {
            let rate = r.items as f64 / r.seconds.max(1e-9);
            println!("{:<50} {:>8} {:>10.3} {:>10.0} {}", r.what, r.items, r.seconds, rate, r.unit);
        }
    }
}

/// `$WHALE_SHARED_DATA`, else `../shared/data` (the layout of a checkout beside `shared/`).
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("WHALE_SHARED_DATA").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("../shared/data"))
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}

fn load(domain: Domain, path: &Path) -> Result<Vec<Task>> {
    ensure!(path.exists(), "{} not found (pass --data DIR or set WHALE_SHARED_DATA)", path.display());
    Ok(task_domain(domain).load(path).into_tasks())
}

/// Runs every benchmark over the shared data in `dir`.
pub fn run(dir: &Path) -> Result<Table> {
    let mut table = Table::default();
    for (file, what) in [
        ("math/gsm8k/test.jsonl", "math verifier (GSM8K test, boxed answer in prose)"),
        ("math/math500/test.jsonl", "math verifier (MATH-500, boxed answer in prose)"),
    ] {
        let tasks = load(Domain::Math, &dir.join(file))?;
        let predictions: Vec<String> = tasks
            .iter()
            .map(|t| {
                format!(
                    "Working through it step by step, the answer is \\boxed{{{}}}.",
                    t.payload["answer"].as_str().unwrap_or("")
                )
            })
            .collect();
        let math = task_domain(Domain::Math);
        let (solved, seconds) =
            timed(|| tasks.iter().zip(&predictions).filter(|(t, p)| math.score(t, p).verdict.success).count());
        ensure!(solved == tasks.len(), "{file}: only {solved} of {} gold answers verify", tasks.len());
        table.rows.push(Row { what: what.into(), items: tasks.len(), seconds, unit: "tasks/s" });
    }
    let file = "chess/kagi_llm_chess_puzzles.csv";
    let tasks = load(Domain::Chess, &dir.join(file))?;
    let (verdicts, seconds) = timed(|| replay_gold(Domain::Chess, &tasks));
    verdicts.with_context(|| format!("replaying {file}"))?;
    table.rows.push(Row {
        what: "chess verifier (Lichess puzzles, gold line)".into(),
        items: tasks.len(),
        seconds,
        unit: "tasks/s",
    });
    let hotpot: Vec<Task> = ["rpt_train_300", "rpt_dev_300", "rpt_test_500"]
        .iter()
        .map(|f| load(Domain::Qa, &dir.join(format!("qa/hotpotqa_distractor_dev/{f}.jsonl"))))
        .collect::<Result<Vec<_>>>()?
        .concat();
    let qa_domain = task_domain(Domain::Qa);
    let (scores, seconds) =
        timed(|| hotpot.iter().map(|t| qa_domain.score(t, &qa::gold_actions(t)[0]).verdict.reward).sum::<f64>());
    ensure!(scores > 0.0, "the QA verifier solved no gold answer");
    table.rows.push(Row {
        what: "qa verifier (HotpotQA, EM + F1)".into(),
        items: hotpot.len(),
        seconds,
        unit: "tasks/s",
    });
    let corpus = qa::corpus_from_tasks(&hotpot);
    let (retriever, seconds) = timed(|| qa::Retriever::in_memory(&corpus));
    let retriever = retriever.context("building the BM25 index")?;
    table.rows.push(Row {
        what: "BM25 index build (HotpotQA contexts)".into(),
        items: corpus.len(),
        seconds,
        unit: "passages/s",
    });
    let questions: Vec<String> =
        hotpot.iter().filter_map(|t| t.payload["question"].as_str().map(String::from)).collect();
    let (hits, seconds) =
        timed(|| questions.iter().map(|q| retriever.search(q, 10).map(|h| h.len())).sum::<Result<usize, _>>());
    hits.context("querying the BM25 index")?;
    table.rows.push(Row {
        what: "BM25 top-10 queries (HotpotQA questions)".into(),
        items: questions.len(),
        seconds,
        unit: "queries/s",
    });
    Ok(table)
}
