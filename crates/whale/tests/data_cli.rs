//! The data commands end to end, through the `whale` binary, on the shared real data.

use std::path::PathBuf;
use std::process::{Command, Output};

fn shared(rel: &str) -> PathBuf {
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    let root = std::env::var_os("WHALE_SHARED_DATA").map(PathBuf::from).unwrap_or(beside);
    root.join(rel)
}

fn whale(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_whale")).args(args).output().expect("the whale binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn check_json(domain: &str, path: &std::path::Path) -> (serde_json::Value, Output) {
    let o = whale(&["data", "check", domain, path.to_str().unwrap(), "--json"]);
    let v = serde_json::from_str(stdout(&o).trim()).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    (v, o)
}

#[test]
fn the_kagi_puzzles_all_check() {
    let (v, o) = check_json("chess", &shared("chess/kagi_llm_chess_puzzles.csv"));
    assert_eq!(v, serde_json::json!({"loaded":1000,"gold_solved":1000,"rejected":0}));
    assert!(o.status.success());
}

#[test]
fn gsm8k_test_solves_1319_of_1319() {
    let o = whale(&["data", "check", "math", shared("math/gsm8k/test.jsonl").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("loaded 1319, gold-solved 1319, rejected 0"), "{}", stdout(&o));
}

#[test]
fn generated_tasks_of_every_domain_check_and_are_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    for (domain, ext, n, difficulty) in
        [("chess", "csv", 200, "1"), ("math", "jsonl", 100, "3"), ("qa", "jsonl", 100, "2")]
    {
        let a = dir.path().join(format!("{domain}-a.{ext}"));
        let b = dir.path().join(format!("{domain}-b.{ext}"));
        for p in [&a, &b] {
            let n = n.to_string();
            let o = whale(&[
                "data",
                "gen",
                domain,
                "--n",
                &n,
                "--seed",
                "1",
                "--difficulty",
                difficulty,
                "-o",
                p.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", stderr(&o));
        }
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "{domain} generator is not deterministic");
        let (v, _) = check_json(domain, &a);
        assert_eq!(v, serde_json::json!({"loaded":n,"gold_solved":n,"rejected":0}), "{domain}");
    }
}

#[test]
fn bad_records_are_listed_with_file_line_and_field_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, "{\"question\":\"1+1?\",\"answer\":\"#### 2\"}\n{\"question\": 3}\nnot json\n").unwrap();
    let o = whale(&["data", "check", "math", path.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["loaded"], 1);
    assert_eq!(v["rejected"], 2);
    let err = stderr(&o);
    assert!(err.contains("bad.jsonl:2:"), "{err}");
    assert!(err.contains("bad.jsonl:3:"), "{err}");
}

#[test]
fn score_reads_predictions_in_every_domain() {
    let dir = tempfile::tempdir().unwrap();
    let math = dir.path().join("math.jsonl");
    std::fs::write(
        &math,
        concat!(
            "{\"question\":\"q\",\"answer\":\"1/2\",\"prediction\":\"so the answer is \\\\boxed{\\\\frac{1}{2}}\"}\n",
            "{\"question\":\"q\",\"answer\":\"7\",\"prediction\":\"8\"}\n",
            "{\"question\":\"q\",\"answer\":\"7\"}\n"
        ),
    )
    .unwrap();
    let o = whale(&["score", "math", math.to_str().unwrap()]);
    let lines: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["reward"], 1.0);
    assert_eq!(lines[1]["reward"], 0.0);
    assert!(lines[2]["error"].as_str().unwrap().contains("prediction"));
    assert_eq!(o.status.code(), Some(1));

    let chess = dir.path().join("chess.jsonl");
    let fen = "r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19";
    let rec = |pred: &str| {
        serde_json::json!({"PuzzleId":"tewjc","FEN":fen,"Moves":"a2a7 e5e3 f2e3 f6a1 a7a1 a8a1","Rating":1493,"prediction":pred})
            .to_string()
    };
    std::fs::write(&chess, format!("{}\n{}\n", rec("e5e3 f6a1 a8a1"), rec("Rxe3 Qxa1 Rxa1"))).unwrap();
    let o = whale(&["score", "chess", chess.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rewards: Vec<f64> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reward"].as_f64().unwrap())
        .collect();
    assert_eq!(rewards, vec![1.0, 1.0]);

    let qa = dir.path().join("qa.jsonl");
    std::fs::write(
        &qa,
        "{\"question\":\"who?\",\"answer\":[\"The Beatles\",\"Beatles\"],\"prediction\":\"the beatles\"}\n",
    )
    .unwrap();
    let o = whale(&["score", "qa", qa.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!((v["reward"].as_f64(), v["em"].as_f64(), v["f1"].as_f64()), (Some(1.0), Some(1.0), Some(1.0)));
}

#[test]
fn unknown_domains_and_missing_files_are_clear_errors() {
    let o = whale(&["data", "check", "poker", "x.jsonl"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown domain `poker`"));
    let o = whale(&["data", "check", "math", "/nonexistent/file.jsonl", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent/file.jsonl:0:"));
}
