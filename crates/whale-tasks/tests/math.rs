//! The math domain end to end: the real GSM8K and MATH-500 files, their answers' equivalences,
//! the calculator, bad input, native round trips and the generator. Answer spellings and
//! extraction on their own are whale-math-answer's tests.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::Zero;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use whale_core::{Domain, Split, Task};
use whale_math_answer::{equivalent, extract_answer, DEFAULT_ORDER};
use whale_tasks::math::{self, CalcError};
use whale_tasks::{Episode, RecordError};

fn data_path(relative: &str) -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data").join(relative);
    if beside_repo.exists() {
        return beside_repo;
    }
    let root = std::env::var("WHALE_SHARED_DATA").expect("shared data not found: set WHALE_SHARED_DATA");
    Path::new(&root).join(relative)
}

fn load_clean(relative: &str, expected: usize) -> Vec<Task> {
    let report = math::load(&data_path(relative));
    assert!(report.rejected.is_empty(), "{relative}: {:?}", &report.rejected[..report.rejected.len().min(5)]);
    assert_eq!(report.tasks.len(), expected, "{relative}");
    let tasks = report.into_tasks();
    let ids: HashSet<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids.len(), tasks.len(), "{relative}: ids are unique");
    tasks
}

fn gold(task: &Task) -> &str {
    task.payload["answer"].as_str().expect("loaded tasks have a string answer")
}

/// Submits `text` in a fresh episode and reports whether it solved the task.
fn submit(task: &Task, text: &str) -> bool {
    let mut episode = math::episode(task).expect("loaded tasks make episodes");
    let outcome = episode.act(text);
    assert!(outcome.done && episode.is_done());
    assert_eq!(outcome.solved, episode.verdict().success);
    outcome.solved
}

fn with_thousands_separators(n: i64) -> String {
    let reversed: Vec<char> = n.unsigned_abs().to_string().chars().rev().collect();
    let groups: Vec<String> = reversed.chunks(3).rev().map(|group| group.iter().rev().collect()).collect();
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", groups.join(","))
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("temp file writable");
    path
}

/// The real GSM8K and MATH-500 files load cleanly and every gold answer verifies.
mod math_real_data {
    use super::*;

    #[test]
    fn gsm8k_loads_completely_and_every_gold_answer_verifies() {
        for (relative, count) in [("math/gsm8k/train.jsonl", 7473), ("math/gsm8k/test.jsonl", 1319)] {
            let tasks = load_clean(relative, count);
            let raw = std::fs::read_to_string(data_path(relative)).expect("readable");
            let stem = Path::new(relative).file_stem().and_then(|s| s.to_str()).expect("a stem");
            for (task, line) in tasks.iter().zip(raw.lines()) {
                let record: Value = serde_json::from_str(line).expect("valid JSON");
                let after_hashes = record["answer"].as_str().and_then(|a| a.rsplit_once("#### ")).map(|(_, x)| x);
                let expected_gold = after_hashes.expect("GSM8K answers end in ####").trim().replace(',', "");
                assert_eq!(gold(task), expected_gold, "{}", task.id);
                assert!(task.id.starts_with(&format!("{stem}-")));
                assert_eq!(task.payload["source"], "gsm8k");
                assert_eq!(task.payload["question"], record["question"]);

                let g: i64 = gold(task).parse().expect("GSM8K gold answers are integers");
                assert!(submit(task, gold(task)), "{}: gold {g}", task.id);
                for variant in [format!("{g}.0"), format!(r"\boxed{{{g}}}"), format!("The answer is {g}.")] {
                    assert!(submit(task, &variant), "{}: {variant}", task.id);
                }
                assert!(submit(task, record["answer"].as_str().unwrap_or_default()), "{}: own solution", task.id);
                if g.abs() >= 1000 {
                    let grouped = with_thousands_separators(g);
                    assert!(submit(task, &grouped) && submit(task, &format!("So she pays ${grouped}.")), "{grouped}");
                }
                assert!(!submit(task, &(g + 1).to_string()), "{}: g+1", task.id);
                assert!(!submit(task, &format!("The answer is {}.", g - 1)), "{}: g-1", task.id);
                if g != 0 {
                    assert!(!submit(task, &(-g).to_string()), "{}: -g", task.id);
                }
            }
        }
    }

    /// Distinct MATH-500 gold strings that are the same answer (checked by hand): the only
    /// pairs `equivalent` may merge.
    const SAME_MATH500_ANSWERS: [(&str, &str); 12] = [
        ("-2,1", "1,-2"),
        (r"10,\!080", "10080"),
        ("120", r"120^\circ"),
        ("15", r"15\mbox{ cm}^2"),
        (r"2 \sqrt{5}", r"2\sqrt{5}"),
        ("30", r"30^\circ"),
        ("36", r"36^\circ"),
        ("36", r"\$36"),
        (r"36^\circ", r"\$36"),
        ("5", "x=5"),
        ("90", r"90^\circ"),
        (r"\frac14", r"\frac{1}{4}"),
    ];

    #[test]
    fn math500_loads_completely_and_every_gold_answer_verifies() {
        let tasks = load_clean("math/math500/test.jsonl", 500);
        let raw = std::fs::read_to_string(data_path("math/math500/test.jsonl")).expect("readable");
        for (task, line) in tasks.iter().zip(raw.lines()) {
            let record: Value = serde_json::from_str(line).expect("valid JSON");
            assert_eq!(task.id, record["unique_id"].as_str().expect("an id"));
            assert_eq!(task.payload["answer"], record["answer"]);
            assert_eq!(task.payload["question"], record["problem"]);
            assert_eq!((&task.payload["level"], &task.payload["subject"]), (&record["level"], &record["subject"]));
            assert_eq!(task.payload["source"], "math500");

            let g = gold(task);
            assert!(equivalent(g, g), "{g}");
            for variant in [
                g.to_string(),
                format!(r"\boxed{{{g}}}"),
                format!("The answer is ${g}$."),
                format!("${g}$"),
                format!("Some reasoning.\n\nFinal answer: $\\boxed{{{g}}}$"),
            ] {
                assert!(submit(task, &variant), "{}: {variant}", task.id);
            }
            // The worked solution ends in the boxed answer, so it solves its own task.
            assert!(submit(task, record["solution"].as_str().expect("a solution")), "{}", task.id);
            if let Ok(n) = g.parse::<i64>() {
                assert!(!submit(task, &(n + 1).to_string()), "{g}+1");
                assert!(n == 0 || !submit(task, &(-n).to_string()), "-{g}");
            }
        }

        let mut distinct: Vec<&str> = tasks.iter().map(gold).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let mut merged = Vec::new();
        for (i, a) in distinct.iter().enumerate() {
            for b in &distinct[i + 1..] {
                if equivalent(a, b) {
                    assert!(equivalent(b, a), "symmetric: {a} {b}");
                    merged.push((*a, *b));
                }
            }
        }
        assert_eq!(merged, SAME_MATH500_ANSWERS.to_vec());
    }

    #[test]
    fn math_records_without_answer_take_the_last_boxed_answer() {
        let raw = std::fs::read_to_string(data_path("math/math500/test.jsonl")).expect("readable");
        for (index, line) in raw.lines().enumerate() {
            let mut record: Value = serde_json::from_str(line).expect("valid JSON");
            let given = record["answer"].as_str().expect("an answer").to_string();
            let fields = record.as_object_mut().expect("an object");
            fields.remove("answer");
            fields.remove("unique_id");
            let subject = fields.remove("subject").expect("a subject");
            let level = format!("Level {}", fields["level"]);
            fields.insert("type".into(), subject);
            fields.insert("level".into(), json!(level));
            let task = math::parse_record(&record, Path::new("/data/MATH/test.jsonl"), index + 1).expect("loads");
            assert_eq!(gold(&task), given);
            assert_eq!(task.id, format!("test-{}", index + 1));
            assert_eq!(task.payload["source"], "math");
            assert!(task.payload["level"].is_i64() && task.payload["subject"].is_string());
        }
    }

    /// What `whale data check` rejects in a math file: records that do not load, and tasks whose
    /// gold answer, submitted as it stands, does not verify.
    fn rejected_by_data_check(path: &Path) -> Vec<String> {
        let report = math::load(path);
        let mut rejected: Vec<String> = report.rejected.iter().map(ToString::to_string).collect();
        let tasks = report.into_tasks();
        let verdicts = whale_tasks::replay_gold(Domain::Math, &tasks).expect("math tasks need no index");
        let failed = tasks.iter().zip(&verdicts).filter(|(_, verdict)| !verdict.success);
        rejected.extend(failed.map(|(task, verdict)| format!("{}: {}", task.id, verdict.detail)));
        rejected
    }

    #[test]
    fn math500_passes_data_check_with_nothing_rejected() {
        let rejected = rejected_by_data_check(&data_path("math/math500/test.jsonl"));
        eprintln!("MATH-500: {} of 500 records rejected", rejected.len());
        assert!(rejected.is_empty(), "{rejected:#?}");
    }

    /// Spellings of MATH-500's `\text{...}` / `\mbox{...}` answers: another text command, with
    /// spaces or a tab between the command and its brace.
    const RESPELLED_TEXT_COMMANDS: [&str; 6] =
        [r"\text {", r"\mbox  {", r"\mathrm {", r"\textrm{", "\\textbf\t{", r"\mbox{"];

    /// Every MATH-500 record whose gold answer has a text command, re-spelled, still passes
    /// `whale data check` and keeps its answer.
    #[test]
    fn math500_text_answers_respelled_with_spaces_still_verify() {
        let dir = tempfile::tempdir().expect("temp dir");
        let raw = std::fs::read_to_string(data_path("math/math500/test.jsonl")).expect("readable");
        let records: Vec<Value> = raw.lines().map(|line| serde_json::from_str(line).expect("valid JSON")).collect();
        let has_text = |answer: &str| answer.contains(r"\text{") || answer.contains(r"\mbox{");
        let with_text: Vec<&Value> = records.iter().filter(|r| has_text(r["answer"].as_str().unwrap_or(""))).collect();
        assert_eq!(with_text.len(), 12, "MATH-500 answers with \\text{{}} or \\mbox{{}}");
        for spelling in RESPELLED_TEXT_COMMANDS {
            let mut lines = Vec::new();
            for record in &with_text {
                let given = record["answer"].as_str().expect("an answer");
                let respelled = given.replace(r"\text{", spelling).replace(r"\mbox{", spelling);
                assert!(equivalent(&respelled, given), "{respelled} == {given}");
                let mut record = (*record).clone();
                record["answer"] = json!(respelled);
                lines.push(record.to_string());
            }
            let path = write_file(dir.path(), "respelled.jsonl", lines.join("\n").as_bytes());
            let rejected = rejected_by_data_check(&path);
            assert!(rejected.is_empty(), "{spelling}: {rejected:#?}");
        }
    }

    /// Issue 33, item 6: a MATH test record whose boxed answer is `8\sqrt{3} \text { square
    /// inches}` was rejected by `whale data check` (its gold answer was read as `3`). Both the
    /// MATH form (answer boxed in the solution) and the MATH-500 form (an `answer` field) load,
    /// their gold answer verifies, and it is the answer 8√3.
    #[test]
    fn spaced_text_unit_after_a_radical_is_accepted() {
        let boxed = r"8\sqrt{3} \text { square inches}";
        let problem = "The triangle's area?";
        let solution = format!(r"The area is $\frac{{1}}{{2}} \cdot 4 \cdot 4\sqrt{{3}} = \boxed{{{boxed}}}$.");
        let math_form = json!({"problem": problem, "solution": solution, "type": "Geometry", "level": "Level 2"});
        let math500_form = json!({"problem": problem, "solution": solution, "answer": boxed, "unique_id": "area"});
        let dir = tempfile::tempdir().expect("temp dir");
        let contents = format!("{math_form}\n{math500_form}");
        let path = write_file(dir.path(), "area.jsonl", contents.as_bytes());
        assert_eq!(rejected_by_data_check(&path), Vec::<String>::new());

        let tasks = math::load(&path).into_tasks();
        assert_eq!(tasks.len(), 2);
        for task in &tasks {
            assert_eq!(gold(task), boxed);
            assert_eq!(extract_answer(gold(task), &DEFAULT_ORDER).as_deref(), Some(boxed));
            assert_eq!(math::score(task, gold(task)).detail, format!("correct: {boxed}"));
            for same in [r"8\sqrt{3}", r"8\sqrt3", r"8 \sqrt 3", r"\sqrt{192}", r"\boxed{8\sqrt{3}}"] {
                assert!(submit(task, same), "{same}");
            }
            for different in ["3", "8", r"8\sqrt{2}", r"3\sqrt{8}"] {
                assert!(!submit(task, different), "{different}");
            }
        }
    }
}

/// Units after radicals and text commands spaced from their braces: made-up gold spellings, each
/// the same answer as a plain spelling and verifying when submitted as it stands.
mod math_units {
    use super::*;

    fn plain_task(answer: &str) -> Task {
        let payload = json!({"question": "q?", "answer": answer, "source": "plain"});
        Task { id: "unit".into(), domain: Domain::Math, payload, split: None }
    }

    /// (gold as written, the same answer written plainly, another answer: mostly the last number,
    /// which a reading that takes the unit for prose returns)
    const SPELLINGS: [(&str, &str, &str); 14] = [
        (r"5\sqrt{2}\text{ cm}", r"5\sqrt2", "2"),
        (r"\sqrt 3 \mbox { units}", r"\sqrt{3}", "3"),
        (r"2\sqrt{6}\ \mathrm {m}^2", r"2\sqrt{6}", "6"),
        (r"4\sqrt{3}\,\textrm  { square feet}", r"\sqrt{48}", "3"),
        (r"\frac{\sqrt{3}}{2} \textbf {meters}", r"\frac{\sqrt3}{2}", "2"),
        (r"7\sqrt{2}\mbox{ cm}^2", r"7\sqrt{2}", "2"),
        (r"\sqrt[3]{2} \text { cm}", r"\sqrt[3]{2}", "2"),
        (r"3\sqrt{5}~\text{\ square inches}", r"3\sqrt{5}", "5"),
        (r"6\sqrt{3} cm", r"6\sqrt{3}", "3"),
        ("12 \\text\t{ inches}", "12", "13"),
        (r"10\mbox {feet}", "10", "11"),
        (r"\mathrm {Evelyn}", "Evelyn", "Navin"),
        (r"\text {(C)}", "(C)", "(D)"),
        (r"\textbf {(E)}", r"\text{(E)}", "(C)"),
    ];

    #[test]
    fn made_up_unit_spellings_verify_as_their_plain_answer() {
        for (spelled, plain, wrong) in SPELLINGS {
            assert!(equivalent(spelled, plain) && equivalent(plain, spelled), "{spelled} == {plain}");
            assert!(!equivalent(spelled, wrong), "{spelled} != {wrong}");
            let task = plain_task(spelled);
            assert!(submit(&task, spelled), "{spelled} verifies as itself");
            assert!(submit(&task, plain) && submit(&task, &format!(r"So it is $\boxed{{{plain}}}$.")), "{spelled}");
            assert!(!submit(&task, wrong), "{spelled} is not {wrong}");
        }
    }
}

/// The calculator against a direct evaluation (property tests).
mod math_calculator {
    use super::*;

    #[derive(Debug, Clone)]
    enum Expr {
        Integer(i64),
        /// `digits / 10^places`, written as a decimal.
        Decimal(i64, u32),
        Neg(Box<Expr>),
        Binary(char, Box<Expr>, Box<Expr>),
        Power(Box<Expr>, i32),
    }

    impl Expr {
        fn render(&self) -> String {
            let operand = |e: &Expr| match e {
                Expr::Integer(_) | Expr::Decimal(..) => e.render(),
                _ => format!("({})", e.render()),
            };
            match self {
                Expr::Integer(n) => n.to_string(),
                Expr::Decimal(digits, places) => {
                    let text = format!("{digits:0>width$}", width = *places as usize + 1);
                    let (whole, fraction) = text.split_at(text.len() - *places as usize);
                    format!("{whole}.{fraction}")
                }
                Expr::Neg(inner) => format!("-{}", operand(inner)),
                Expr::Binary(op, left, right) => {
                    format!("{} {op} {}", operand(left), operand(right))
                }
                Expr::Power(base, exponent) if *exponent < 0 => {
                    format!("{}^({exponent})", operand(base))
                }
                Expr::Power(base, exponent) => format!("{}^{exponent}", operand(base)),
            }
        }

        /// The exact value, or `None` on a division by zero.
        fn value(&self) -> Option<BigRational> {
            Some(match self {
                Expr::Integer(n) => BigRational::from_integer((*n).into()),
                Expr::Decimal(digits, places) => BigRational::new((*digits).into(), BigInt::from(10).pow(*places)),
                Expr::Neg(inner) => -inner.value()?,
                Expr::Binary(op, left, right) => {
                    let (l, r) = (left.value()?, right.value()?);
                    match op {
                        '+' => l + r,
                        '-' => l - r,
                        '*' => l * r,
                        _ if r.is_zero() => return None,
                        _ => l / r,
                    }
                }
                Expr::Power(base, exponent) => {
                    let b = base.value()?;
                    if b.is_zero() && *exponent < 0 {
                        return None;
                    }
                    num_traits::Pow::pow(b, *exponent)
                }
            })
        }
    }

    fn expressions() -> impl Strategy<Value = Expr> {
        let leaf = prop_oneof![
            (0i64..1000).prop_map(Expr::Integer),
            (0i64..100_000, 1u32..4).prop_map(|(d, p)| Expr::Decimal(d, p)),
        ];
        leaf.prop_recursive(4, 24, 2, |inner| {
            prop_oneof![
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                (prop::sample::select(vec!['+', '-', '*', '/']), inner.clone(), inner.clone())
                    .prop_map(|(op, l, r)| Expr::Binary(op, Box::new(l), Box::new(r))),
                (inner, -3i32..=3).prop_map(|(base, e)| Expr::Power(Box::new(base), e)),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn calculator_agrees_with_direct_evaluation(expr in expressions()) {
            let text = expr.render();
            match expr.value() {
                Some(expected) => prop_assert_eq!(math::calculate(&text).map(|v| v.0), Ok(expected), "{}", text),
                None => prop_assert!(
                    matches!(math::calculate(&text), Err(CalcError::DivisionByZero { .. })),
                    "{} should divide by zero", text
                ),
            }
        }

        #[test]
        fn calculator_rejects_garbage_without_panicking(text in "\\PC{0,80}") {
            let result = math::calculate(&text);
            if text.chars().any(|c| c.is_alphabetic() || c == '%' || c == '=') {
                prop_assert!(result.is_err(), "{} was accepted", text);
            }
        }

        #[test]
        fn calculator_survives_operator_soup(text in r"[0-9.+\-*/^() ]{0,120}") {
            if let Err(error) = math::calculate(&text) {
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }
}

/// Bad input: every problem becomes a RecordError naming file, line and field.
mod math_bad_input {
    use super::*;

    fn error_at(errors: &[RecordError], line: usize) -> &RecordError {
        errors.iter().find(|e| e.line == line).unwrap_or_else(|| panic!("no error on line {line}: {errors:?}"))
    }

    #[test]
    fn every_bad_line_is_reported_and_good_lines_still_load() {
        let dir = tempfile::tempdir().expect("temp dir");
        let lines: [&[u8]; 12] = [
            br#"{"question": "What is 2+2?", "answer": 4}"#,
            br#"{"question": "broken", "answer": "#,
            b"",
            br#"{"question": "Only a question"}"#,
            br#"{"question": "Mistyped", "answer": true}"#,
            b"{\"question\": \"caf\xff\", \"answer\": \"1\"}",
            br#"{"question": 7, "answer": "1"}"#,
            br#"{"problem": "No box", "solution": "So it is 5."}"#,
            br#"["not", "an", "object"]"#,
            br#"{"id": "a", "question": "Q", "answer": "x"}"#,
            br#"{"id": "a", "question": "Q2", "answer": "y"}"#,
            br#"{"question": "Steps", "answer": "2 + 2 = 4\n#### 4"}"#,
        ];
        let path = write_file(dir.path(), "mixed.jsonl", &lines.join(&b'\n'));
        let report = math::load(&path);

        let loaded: Vec<(usize, &str)> = report.tasks.iter().map(|(line, task)| (*line, gold(task))).collect();
        assert_eq!(loaded, vec![(1, "4"), (10, "x"), (12, "4")]);
        assert_eq!(report.tasks[0].1.id, "mixed-1");
        assert_eq!(report.tasks[0].1.payload["source"], "plain");
        assert_eq!(report.tasks[2].1.payload["source"], "gsm8k");
        assert_eq!(report.rejected.len(), 8, "{:#?}", report.rejected);
        assert!(report.rejected.iter().all(|e| e.file == path));

        let expect = |line: usize, field: Option<&str>, reason: &str| {
            let error = error_at(&report.rejected, line);
            assert_eq!(error.field.as_deref(), field, "line {line}: {error}");
            assert!(error.reason.contains(reason), "line {line}: {error}");
        };
        expect(2, None, "malformed JSON");
        expect(4, Some("answer"), "missing");
        expect(5, Some("answer"), "expected a string or a number, found a boolean");
        expect(6, None, "not valid UTF-8");
        expect(7, Some("question"), "expected a string, found a number");
        expect(8, Some("solution"), r"\boxed");
        expect(9, None, "expected a JSON object");
        expect(11, Some("id"), "duplicate id `a` (first used on line 10)");
        assert!(error_at(&report.rejected, 6).to_string().starts_with(&format!("{}:6: ", path.display())));
    }

    #[test]
    fn a_math_record_with_an_answer_needs_no_solution() {
        let dir = tempfile::tempdir().expect("temp dir");
        let lines: [&[u8]; 5] = [
            br#"{"problem": "Find $x$ if $2x = 14$.", "answer": "7"}"#,
            br#"{"problem": "AIME-style: how many?", "answer": 204, "level": "Level 5"}"#,
            br#"{"problem": "Neither answer nor solution"}"#,
            br#"{"problem": "Boxed only", "solution": "It is $\\boxed{12}$."}"#,
            br#"{"problem": "Area?", "solution": "So $\\boxed{8\\sqrt{3} \\text { square inches}}$."}"#,
        ];
        let path = write_file(dir.path(), "aime.jsonl", &lines.join(&b'\n'));
        let report = math::load(&path);
        let loaded: Vec<(usize, &str)> = report.tasks.iter().map(|(line, task)| (*line, gold(task))).collect();
        assert_eq!(loaded, vec![(1, "7"), (2, "204"), (4, "12"), (5, r"8\sqrt{3} \text { square inches}")]);
        let area = &report.tasks[3].1;
        assert!(submit(area, area.payload["solution"].as_str().expect("kept")), "the gold verifies against itself");
        assert!(submit(area, r"\boxed{8\sqrt{3}}"));
        assert!(report.tasks[0].1.payload.get("solution").is_none());
        assert_eq!(report.tasks[1].1.payload["level"], 5);
        assert!(submit(&report.tasks[1].1, "The answer is \\boxed{204}."));
        let [error] = report.rejected.as_slice() else { panic!("{:#?}", report.rejected) };
        assert_eq!((error.line, error.field.as_deref()), (3, Some("answer")), "{error}");
        assert!(error.reason.contains("no `solution`"), "{error}");
    }

    #[test]
    fn one_problem_per_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cases: [(&str, &[u8], Option<&str>, &str); 5] = [
            ("malformed.jsonl", b"{\"question\": \"x\",", None, "malformed JSON"),
            ("missing.jsonl", br#"{"answer": "1"}"#, Some("question"), "missing"),
            ("mistyped.jsonl", br#"{"question": "q", "answer": ["1"]}"#, Some("answer"), "found an array"),
            ("utf8.jsonl", b"{\"question\": \"\xc3\x28\", \"answer\": \"1\"}\n", None, "not valid UTF-8"),
            (
                "native.jsonl",
                br#"{"id": "n", "domain": "math", "payload": {"question": "q", "answer": "1", "source": "web"}}"#,
                Some("payload.source"),
                "expected one of",
            ),
        ];
        for (name, bytes, field, reason) in cases {
            let path = write_file(dir.path(), name, bytes);
            let report = math::load(&path);
            assert!(report.tasks.is_empty(), "{name}");
            assert_eq!(report.rejected.len(), 1, "{name}: {:?}", report.rejected);
            let error = &report.rejected[0];
            assert_eq!(
                (error.file.as_path(), error.line, error.field.as_deref()),
                (path.as_path(), 1, field),
                "{name}"
            );
            assert!(error.reason.contains(reason), "{name}: {error}");
        }

        for contents in [&b""[..], b"\n\n  \n"] {
            let path = write_file(dir.path(), "empty.jsonl", contents);
            let report = math::load(&path);
            assert_eq!(report.rejected.len(), 1);
            let error = &report.rejected[0];
            assert_eq!((error.file.as_path(), error.line, error.field.as_deref()), (path.as_path(), 0, None));
            assert!(error.reason.starts_with("file is empty"), "{error}");
            assert!(report.tasks.is_empty());
        }
        let missing = math::load(&dir.path().join("absent.jsonl"));
        assert_eq!((missing.rejected.len(), missing.rejected[0].line), (1, 0));
        assert!(missing.rejected[0].reason.contains("cannot read"));
    }

    #[test]
    fn plain_records_accept_string_and_number_answers() {
        let file = Path::new("plain.jsonl");
        let parse = |value: Value| math::parse_record(&value, file, 3).expect("accepted");
        let number = parse(json!({"question": "Half of one?", "answer": 0.5}));
        assert_eq!((gold(&number), &number.id), ("0.5", &"plain-3".to_string()));
        assert!(submit(&number, r"\frac{1}{2}"));
        let text = parse(json!({"id": 17, "question": "Which?", "answer": r"\text{(B)}"}));
        assert_eq!(text.id, "17");
        assert!(submit(&text, "The answer is (B).") && !submit(&text, "The answer is (C)."));
        let error = math::parse_record(&json!({"id": false, "question": "q", "answer": "1"}), file, 4).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("id"));
    }

    #[test]
    fn a_null_id_is_no_id_and_a_unique_id_may_be_an_integer() {
        let file = Path::new("export.jsonl");
        let parse = |value: Value| math::parse_record(&value, file, 2).expect("accepted");
        assert_eq!(parse(json!({"id": null, "question": "q", "answer": "1"})).id, "export-2");
        assert_eq!(parse(json!({"problem": "p", "answer": "1", "unique_id": 42})).id, "42");
    }

    #[test]
    fn a_bom_crlf_json_array_file_loads_every_record() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bytes = b"\xEF\xBB\xBF[\r\n {\"question\": \"q1\", \"answer\": \"a\\n#### 1,234\"},\r\n {\"problem\": \"p\", \"answer\": \"-\\\\frac{3}{4}\"}\r\n]\r\n";
        let report = math::load(&write_file(dir.path(), "array.json", bytes));
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        let loaded: Vec<(usize, &str)> = report.tasks.iter().map(|(line, task)| (*line, gold(task))).collect();
        assert_eq!(loaded, vec![(2, "1234"), (3, r"-\frac{3}{4}")]);
        assert!(submit(&report.tasks[1].1, "-0.75"));
    }

    /// Python's `json.dump` writes the array on one line: records without ids must still be
    /// told apart, by their position.
    #[test]
    fn a_one_line_json_array_without_ids_numbers_its_records_by_position() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bytes = br#####"[{"question": "q1", "answer": "#### 1"}, {"question": "q2", "answer": "#### 2"}, {"question": "q3", "answer": "#### 3"}]"#####;
        let report = math::load(&write_file(dir.path(), "dump.json", bytes));
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        let ids: Vec<(usize, &str)> = report.tasks.iter().map(|(number, task)| (*number, task.id.as_str())).collect();
        assert_eq!(ids, vec![(1, "dump-1"), (2, "dump-2"), (3, "dump-3")]);
    }

    #[test]
    fn a_gzip_file_is_refused_in_one_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let report = math::load(&write_file(dir.path(), "test.jsonl.gz", b"\x1F\x8B\x08\x00\xff\n\xfe"));
        assert!(report.tasks.is_empty());
        let [error] = report.rejected.as_slice() else { panic!("{:#?}", report.rejected) };
        assert!(error.line == 0 && error.reason.contains("gzip"), "{error}");
    }
}

/// Native round trip and the public view.
mod math_native {
    use super::*;

    #[test]
    fn native_files_round_trip() {
        let mut tasks = load_clean("math/gsm8k/test.jsonl", 1319);
        tasks.extend(load_clean("math/math500/test.jsonl", 500));
        tasks.extend(math::generate(50, 11, 3));
        for (i, task) in tasks.iter_mut().enumerate() {
            task.split = [None, Some(Split::Train), Some(Split::Search), Some(Split::Test)][i % 4];
        }
        let mut bytes = Vec::new();
        math::write_native(&tasks, &mut bytes).expect("writes to memory");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(dir.path(), "native.jsonl", &bytes);
        let report = math::load(&path);
        assert!(report.rejected.is_empty(), "{:?}", report.rejected.first());
        assert_eq!(report.into_tasks(), tasks);
    }

    #[test]
    fn public_view_hides_the_gold_answer() {
        for task in load_clean("math/math500/test.jsonl", 500).iter().chain(&math::generate(5, 1, 2)) {
            let view = math::public_view(task);
            assert!(view.get("answer").is_none() && view.get("solution").is_none());
            assert_eq!(view["question"], task.payload["question"]);
            assert_eq!(view["source"], task.payload["source"]);
            assert_eq!(math::gold_actions(task), vec![gold(task).to_string()]);
            let episode = math::episode(task).expect("an episode");
            assert_eq!(episode.observation(), task.payload["question"].as_str().expect("text"));
        }
    }
}

/// The generator: determinism, solvability, difficulty.
mod math_generator {
    use super::*;

    /// Checks every `description: expression = value.` line with the calculator; returns the
    /// number of steps.
    fn verify_solution(task: &Task) -> usize {
        let solution = task.payload["solution"].as_str().expect("generated tasks carry a solution");
        let (steps, last) = solution.rsplit_once('\n').expect("steps, then the answer line");
        assert_eq!(last, format!("#### {}", gold(task)));
        let mut previous = None;
        for line in steps.lines() {
            let (_, arithmetic) = line.rsplit_once(": ").expect("description: arithmetic");
            let (expression, value) = arithmetic.trim_end_matches('.').split_once(" = ").expect("expression = value");
            let computed = math::calculate(expression).expect("a valid expression").0;
            assert_eq!(computed.to_string(), value, "{}: {line}", task.id);
            previous = Some(value);
        }
        assert_eq!(previous, Some(gold(task)), "{}", task.id);
        steps.lines().count()
    }

    #[test]
    fn generated_tasks_are_deterministic_and_solvable() {
        let tasks = math::generate(200, 42, 3);
        assert_eq!(tasks, math::generate(200, 42, 3));
        assert_eq!(tasks[..20], math::generate(20, 42, 3)[..]);
        let other = math::generate(200, 43, 3);
        let differing =
            tasks.iter().zip(&other).filter(|(a, b)| a.payload["question"] != b.payload["question"]).count();
        assert!(differing > 190, "seeds 42 and 43 share {} questions", 200 - differing);

        let questions: HashSet<&str> = tasks.iter().map(|t| t.payload["question"].as_str().unwrap_or("")).collect();
        assert!(questions.len() > 190, "only {} distinct questions", questions.len());
        let templates: HashSet<&str> = tasks.iter().map(|t| t.payload["subject"].as_str().unwrap_or("")).collect();
        assert_eq!(templates.len(), 4, "{templates:?}");

        for (i, task) in tasks.iter().enumerate() {
            assert_eq!(task.id, format!("gen-math-d3-42-{i}"));
            assert_eq!(task.domain, Domain::Math);
            assert_eq!((&task.payload["source"], &task.payload["difficulty"]), (&json!("generated"), &json!(3)));
            assert!(gold(task).parse::<i64>().is_ok_and(|g| g >= 0), "{}", gold(task));
            verify_solution(task);
            assert!(submit(task, gold(task)));
            assert!(submit(task, task.payload["solution"].as_str().unwrap_or("")), "{}", task.id);
            let wrong = gold(task).parse::<i64>().map(|g| g + 1).unwrap_or_default();
            assert!(!submit(task, &format!("#### {wrong}")));
        }
    }

    #[test]
    fn difficulty_grows_steps_and_numbers() {
        let mut previous: Option<(f64, f64)> = None;
        for difficulty in 1..=5 {
            let tasks = math::generate(120, 7, difficulty);
            let steps: Vec<usize> = tasks.iter().map(verify_solution).collect();
            let mean_steps = steps.iter().sum::<usize>() as f64 / steps.len() as f64;
            let largest_number = |t: &Task| {
                let question = t.payload["question"].as_str().unwrap_or("");
                question.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<f64>().ok()).fold(0.0, f64::max)
            };
            let mean_largest = tasks.iter().map(largest_number).sum::<f64>() / tasks.len() as f64;
            if let Some((last_steps, last_largest)) = previous {
                assert!(mean_steps > last_steps, "d={difficulty}: {mean_steps} steps vs {last_steps}");
                assert!(mean_largest > last_largest, "d={difficulty}: numbers {mean_largest} vs {last_largest}");
            }
            assert!(steps.iter().all(|&s| s > difficulty as usize), "d={difficulty}: {steps:?}");
            previous = Some((mean_steps, mean_largest));
        }
    }
}
