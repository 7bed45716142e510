//! The QA domain on the real data in `shared/data/qa` and on generated tasks.

/// Named `qa` so that `cargo test qa` selects these tests.
mod qa {
    use serde_json::json;
    use std::collections::HashSet;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, OnceLock};
    use whale_core::{Domain, Task};
    use whale_tasks::qa::{self, IndexOrigin, Passage, QaConfig, QaPayload, Retriever, RewardMetric};
    use whale_tasks::{Episode, ToolError};

    const HOTPOT_FILES: [(&str, usize); 3] =
        [("rpt_train_300.jsonl", 300), ("rpt_dev_300.jsonl", 300), ("rpt_test_500.jsonl", 500)];

    fn data_dir() -> PathBuf {
        let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
        if beside_repo.is_dir() {
            return beside_repo;
        }
        std::env::var_os("WHALE_SHARED_DATA")
            .map(PathBuf::from)
            .expect("shared data not found beside the repository; set WHALE_SHARED_DATA")
    }

    fn qa_file(relative: &str) -> PathBuf {
        data_dir().join("qa").join(relative)
    }

    /// All 1100 HotpotQA questions, loaded once per test run.
    fn hotpot_tasks() -> &'static [Task] {
        static TASKS: OnceLock<Vec<Task>> = OnceLock::new();
        TASKS.get_or_init(|| {
            HOTPOT_FILES
                .iter()
                .flat_map(|(name, _)| qa::load(&qa_file(&format!("hotpotqa_distractor_dev/{name}"))).into_tasks())
                .collect()
        })
    }

    /// A BM25 index over the context paragraphs of all HotpotQA questions.
    fn hotpot_retriever() -> Arc<Retriever> {
        static RETRIEVER: OnceLock<Arc<Retriever>> = OnceLock::new();
        RETRIEVER
            .get_or_init(|| {
                Arc::new(Retriever::in_memory(&qa::corpus_from_tasks(hotpot_tasks())).expect("index builds"))
            })
            .clone()
    }

    fn payload(task: &Task) -> QaPayload {
        QaPayload::from_task(task).expect("a QA payload")
    }

    /// Replays the gold actions in a fresh episode and returns whether the episode was solved.
    fn gold_solves(task: &Task, retriever: &Arc<Retriever>) -> bool {
        let mut episode = qa::episode(task, retriever.clone(), &QaConfig::default());
        let outcomes: Vec<_> = qa::gold_actions(task).iter().map(|a| episode.act(a)).collect();
        let verdict = episode.verdict();
        episode.is_done() && outcomes.iter().all(|o| !o.invalid) && verdict.success && verdict.reward == 1.0
    }

    #[test]
    fn hotpotqa_files_load_completely_and_gold_replay_solves() {
        let retriever = hotpot_retriever();
        for (name, expected) in HOTPOT_FILES {
            let report = qa::load(&qa_file(&format!("hotpotqa_distractor_dev/{name}")));
            assert!(report.rejected.is_empty(), "{name}: {:?}", &report.rejected[..report.rejected.len().min(3)]);
            assert_eq!(report.tasks.len(), expected, "{name}");
            for (_, task) in &report.tasks {
                let p = payload(task);
                assert_eq!(task.domain, Domain::Qa);
                assert_eq!(p.source, qa::Source::Hotpotqa);
                assert!(!p.context.is_empty() && !p.supporting_titles.is_empty(), "{}", task.id);
                assert!(gold_solves(task, &retriever), "{}", task.id);
            }
        }
        let first = &hotpot_tasks()[0];
        assert_eq!(first.id, "5abf63f15542997ec76fd3ea");
        assert_eq!(payload(first).supporting_titles, ["Socialist Revolutionary Party", "Russian Civil War"]);
    }

    #[test]
    fn nq_open_and_flashrag_load_completely_and_gold_replay_solves() {
        let retriever = Arc::new(Retriever::in_memory(&[]).expect("empty index builds"));
        for (name, expected, source) in [
            ("nq_open/NQ-open.dev.jsonl", 3610, qa::Source::NqOpen),
            ("nq_open/flashrag_nq_test_subsample_1000.jsonl", 1000, qa::Source::Flashrag),
        ] {
            let report = qa::load(&qa_file(name));
            assert!(report.rejected.is_empty(), "{name}: {:?}", &report.rejected[..report.rejected.len().min(3)]);
            assert_eq!(report.tasks.len(), expected, "{name}");
            for (_, task) in &report.tasks {
                assert_eq!(payload(task).source, source);
                assert!(gold_solves(task, &retriever), "{}", task.id);
            }
        }
        let nq = qa::load(&qa_file("nq_open/NQ-open.dev.jsonl")).into_tasks();
        assert_eq!(nq[1].id, "NQ-open.dev-2");
        assert_eq!(payload(&nq[1]).answers, ["Bobby Scott", "Bob Russell"]);
        assert!(qa::score(&nq[1], "bob russell").verdict.success);
    }

    #[test]
    fn flashrag_wiki_corpus_loads_and_is_searchable() {
        let (passages, errors) =
            qa::load_corpus(&qa_file("corpus_flashrag_wiki_sample/wiki_sample_1000_passages.jsonl"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(passages.len(), 1000);
        assert_eq!(passages[0].id, "0");
        assert_eq!(passages[0].title, "Evan Morris");
        assert!(passages[0].text.starts_with("Evan Morris Evan L. Morris (January 26, 1977"));
        let retriever = Retriever::in_memory(&passages).expect("index builds");
        assert_eq!(retriever.len(), 1000);
        let hits = retriever.search("Who was the lobbyist for Genentech and Roche?", 3).expect("search");
        assert_eq!(hits[0].title, "Evan Morris");
    }

    #[test]
    fn hotpotqa_corpus_is_the_distinct_context_paragraphs() {
        let tasks = hotpot_tasks();
        let corpus = qa::corpus_from_tasks(tasks);
        let paragraphs: Vec<(String, String)> =
            tasks.iter().flat_map(|t| payload(t).context).map(|p| (p.title, p.text)).collect();
        let distinct: HashSet<&(String, String)> = paragraphs.iter().collect();
        let in_corpus: HashSet<(String, String)> = corpus.iter().map(|p| (p.title.clone(), p.text.clone())).collect();
        eprintln!("HotpotQA corpus: {} context paragraphs, {} distinct passages", paragraphs.len(), corpus.len());
        assert_eq!(corpus.len(), distinct.len(), "no duplicate passages");
        assert!(corpus.len() < paragraphs.len(), "questions share paragraphs");
        assert!(distinct.iter().all(|p| in_corpus.contains(*p)), "every paragraph is in the corpus");
        let ids: HashSet<&str> = corpus.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids.len(), corpus.len());
    }

    #[test]
    fn bm25_recalls_supporting_paragraphs_of_hotpotqa_questions() {
        let retriever = hotpot_retriever();
        let tasks = hotpot_tasks();
        let (mut any_found, mut all_found, mut first_hit_supporting) = (0usize, 0usize, 0usize);
        for task in tasks {
            let p = payload(task);
            let hits = retriever.search(&p.question, 10).expect("search");
            let titles: HashSet<&str> = hits.iter().map(|h| h.title.as_str()).collect();
            let found = p.supporting_titles.iter().filter(|t| titles.contains(t.as_str())).count();
            any_found += usize::from(found > 0);
            all_found += usize::from(found == p.supporting_titles.len());
            first_hit_supporting += usize::from(hits.first().is_some_and(|h| p.supporting_titles.contains(&h.title)));
        }
        let n = tasks.len() as f64;
        let (any, all, top1) = (any_found as f64 / n, all_found as f64 / n, first_hit_supporting as f64 / n);
        eprintln!(
            "HotpotQA BM25 over {} questions: recall@10 any {any:.3}, all {all:.3}; top-1 supporting {top1:.3}",
            tasks.len()
        );
        assert!(any >= 0.97, "recall@10 (any supporting paragraph) {any:.3}");
        assert!(all >= 0.65, "recall@10 (all supporting paragraphs) {all:.3}");
    }

    fn sample_passages(n: usize) -> Vec<Passage> {
        (0..n)
            .map(|i| Passage {
                id: format!("p{i}"),
                title: format!("Topic {i}"),
                text: format!("Passage number {i} about item{i}."),
            })
            .collect()
    }

    #[test]
    fn on_disk_index_is_reused_while_the_corpus_is_unchanged() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut passages = sample_passages(50);
        let built = Retriever::open_or_build(&passages, dir.path()).expect("build");
        assert_eq!(built.origin(), IndexOrigin::Built);
        let before = built.search("item7", 1).expect("search");
        drop(built);

        let reused = Retriever::open_or_build(&passages, dir.path()).expect("reopen");
        assert_eq!(reused.origin(), IndexOrigin::Reused);
        assert_eq!(reused.len(), 50);
        assert_eq!(reused.search("item7", 1).expect("search"), before);
        drop(reused);

        passages[7].text = "Rewritten passage about zanzibar.".into();
        passages.truncate(40);
        let rebuilt = Retriever::open_or_build(&passages, dir.path()).expect("rebuild");
        assert_eq!(rebuilt.origin(), IndexOrigin::Built);
        assert_eq!(rebuilt.len(), 40);
        assert!(rebuilt.search("item7", 5).expect("search").is_empty());
        assert_eq!(rebuilt.search("zanzibar", 5).expect("search")[0].id, "p7");
        drop(rebuilt);

        std::fs::remove_file(dir.path().join("meta.json")).expect("the index has a meta.json");
        let restored = Retriever::open_or_build(&passages, dir.path()).expect("rebuild");
        assert_eq!((restored.origin(), restored.len()), (IndexOrigin::Built, 40));
        drop(restored);

        std::fs::write(dir.path().join(qa::FINGERPRINT_FILE), "stale\n").expect("write");
        assert_eq!(Retriever::open_or_build(&passages, dir.path()).expect("rebuild").origin(), IndexOrigin::Built);
        assert_eq!(Retriever::open_or_build(&passages, dir.path()).expect("reuse").origin(), IndexOrigin::Reused);
    }

    #[test]
    fn search_survives_query_syntax_and_respects_k() {
        let retriever = Retriever::in_memory(&sample_passages(20)).expect("index");
        for query in ["title:\"item3", "(item3 AND -item4) OR", "item3^2 ~ [a TO", "", "?!"] {
            let hits = retriever.search(query, 3).expect("query syntax is not interpreted");
            assert!(hits.len() <= 3);
        }
        assert_eq!(retriever.search("what about item3?", 3).expect("search")[0].id, "p3");
        assert!(retriever.search("item3", 0).expect("search").is_empty());
        assert!(retriever.search("the of and", 5).expect("search").is_empty());
    }

    fn aliases(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exact_match_and_f1_agree_with_squad_on_hand_picked_cases() {
        assert!(qa::exact_match("The Eiffel Tower", &aliases(&["eiffel tower"])));
        assert!(qa::exact_match("eiffel-tower", &aliases(&["Louvre", "eiffeltower"])));
        assert!(!qa::exact_match("Eiffel", &aliases(&["eiffel tower"])));
        assert_eq!(qa::normalize_answer("  A  Tale of the Two Cities! "), "tale of two cities");
        // "tall eiffel tower in paris" vs "eiffel tower": 2 shared tokens, P = 2/5, R = 1.
        let partial = qa::f1("the tall Eiffel Tower in Paris", &aliases(&["Eiffel Tower"]));
        assert!((partial - 2.0 * 0.4 / 1.4).abs() < 1e-12, "{partial}");
        // Best alias: "barack hussein obama" gives P = 1, R = 2/3 -> 0.8 (beats 2/3 against "obama").
        let best = qa::f1("Barack Obama", &aliases(&["Obama", "Barack Hussein Obama"]));
        assert!((best - 0.8).abs() < 1e-12, "{best}");
        assert_eq!(qa::f1("yes", &aliases(&["no"])), 0.0);
        assert_eq!(qa::f1("yes it is", &aliases(&["yes"])), 0.0);
        assert_eq!(qa::f1("no", &aliases(&["no way"])), 0.0);
        assert_eq!(qa::f1("Yes.", &aliases(&["yes"])), 1.0);
        assert_eq!(qa::f1("anything", &[]), 0.0);
    }

    /// The official HotpotQA release (one JSON array; `_id`; `context` and `supporting_facts` as
    /// lists of pairs) reads as the same tasks as Hugging Face's shape of the same records, and
    /// its malformed entries are named by position.
    #[test]
    fn the_official_hotpotqa_shape_reads_as_the_datasets_shape() {
        let dir = tempfile::tempdir().expect("temp dir");
        let official = json!([{
            "_id": "q1", "question": "Which river flows past both towns?", "answer": "the Vell",
            "type": "bridge", "level": "medium",
            "supporting_facts": [["Arnby", 1], ["Orsk", 0], ["Arnby", 0]],
            "context": [
                ["Arnby", ["Arnby is a market town.", " It lies on the Vell."]],
                ["Decoy", ["Decoy is a hamlet."]],
                ["Orsk", ["Orsk stands where the Vell meets the sea."]]
            ]
        }]);
        let datasets = json!({
            "id": "q1", "question": "Which river flows past both towns?", "answer": "the Vell",
            "type": "bridge", "level": "medium",
            "supporting_facts": {"title": ["Arnby", "Orsk", "Arnby"], "sent_id": [1, 0, 0]},
            "context": {
                "title": ["Arnby", "Decoy", "Orsk"],
                "sentences": [
                    ["Arnby is a market town.", " It lies on the Vell."],
                    ["Decoy is a hamlet."],
                    ["Orsk stands where the Vell meets the sea."]
                ]
            }
        });
        let (official_path, datasets_path) = (dir.path().join("official.json"), dir.path().join("datasets.jsonl"));
        std::fs::write(&official_path, official.to_string()).expect("write");
        std::fs::write(&datasets_path, datasets.to_string()).expect("write");
        let (from_official, from_datasets) = (qa::load(&official_path), qa::load(&datasets_path));
        assert!(from_official.rejected.is_empty(), "{:?}", from_official.rejected);
        let task = &from_official.tasks[0].1;
        assert_eq!(task, &from_datasets.tasks[0].1);
        let payload = QaPayload::from_task(task).expect("a QA payload");
        assert_eq!(
            (task.id.as_str(), payload.supporting_titles),
            ("q1", vec!["Arnby".to_string(), "Orsk".to_string()])
        );
        assert_eq!(payload.context[0].text, "Arnby is a market town. It lies on the Vell.");

        let bad = [
            (json!([["Arnby", ["s"]], ["Decoy"]]), json!([]), "context[1]"),
            (json!([["Arnby", ["s"]]]), json!([["Nowhere", 0]]), "supporting_facts[0][0]"),
            (json!([["Arnby", ["s"]]]), json!([["Arnby", -1]]), "supporting_facts[0][1]"),
            (json!([[7, ["s"]]]), json!([]), "context[0][0]"),
        ];
        for (context, facts, field) in bad {
            let record =
                json!({"_id": "b", "question": "q", "answer": "a", "context": context, "supporting_facts": facts});
            std::fs::write(&official_path, record.to_string()).expect("write");
            let report = qa::load(&official_path);
            assert_eq!(report.rejected.len(), 1, "{field}");
            assert_eq!(report.rejected[0].field.as_deref(), Some(field), "{}", report.rejected[0]);
        }
    }

    #[test]
    fn every_bad_record_is_reported_with_its_line_and_field() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("mixed.jsonl");
        let lines: Vec<Vec<u8>> = vec![
        br#"{"question": "who?", "answer": ["Ada"]}"#.to_vec(),
        br#"{"question": "who?", "answer": "Ada"}"#.to_vec(),
        br#"{"question": "who?", "answer": ["Ada"]"#.to_vec(),
        b"{\"question\": \"caf\xe9\", \"answer\": [\"x\"]}".to_vec(),
        br#"{"id": "h1", "question": "q", "answer": "a", "context": {"title": ["A", "B"], "sentences": [["s"]]}}"#.to_vec(),
        br#"{"id": "h2", "question": "q", "answer": "a", "supporting_facts": {"title": ["C"], "sent_id": [0]}, "context": {"title": ["A"], "sentences": [["s"]]}}"#.to_vec(),
        br#"{"id": "f1", "question": "q", "golden_answers": []}"#.to_vec(),
        br#"{"id": "f2", "question": "q", "golden_answers": ["ok", 3]}"#.to_vec(),
        br#"{"answer": ["x"]}"#.to_vec(),
        br#"[1, 2]"#.to_vec(),
        b"   ".to_vec(),
        br#"{"id": "f3", "question": "q", "golden_answers": ["ok"]}"#.to_vec(),
        br#"{"question": "q"}"#.to_vec(),
        br#"{"id": "h3", "question": "q", "answer": "a", "context": {"title": ["A", "B"], "sentences": [["s"], [7]]}}"#.to_vec(),
        br#"{"id": "f3", "question": "again", "golden_answers": ["ok"]}"#.to_vec(),
        br#"{"id": "h4", "question": "q", "answer": "a", "supporting_facts": {"title": ["A"], "sent_id": [-1]}, "context": {"title": ["A"], "sentences": [["s"]]}}"#.to_vec(),
        br#"{"id": "h5", "question": "  ", "answer": "a", "context": {"title": [], "sentences": []}}"#.to_vec(),
    ];
        std::fs::write(&path, lines.join(&b'\n')).expect("write");
        let report = qa::load(&path);
        let loaded: Vec<(usize, &str)> = report.tasks.iter().map(|(line, t)| (*line, t.id.as_str())).collect();
        assert_eq!(loaded, [(1, "mixed-1"), (12, "f3")]);
        let rejected: Vec<(usize, Option<&str>)> =
            report.rejected.iter().map(|e| (e.line, e.field.as_deref())).collect();
        assert_eq!(
            rejected,
            [
                (2, Some("answer")),
                (3, None),
                (4, None),
                (5, Some("context")),
                (6, Some("supporting_facts.title[0]")),
                (7, Some("golden_answers")),
                (8, Some("golden_answers[1]")),
                (9, Some("question")),
                (10, None),
                (13, Some("answer")),
                (14, Some("context.sentences[1][0]")),
                (15, Some("id")),
                (16, Some("supporting_facts.sent_id[0]")),
                (17, Some("question")),
            ]
        );
        assert!(report.rejected[2].reason.contains("UTF-8"));
        assert!(report.rejected.iter().all(|e| e.file == path));
        assert!(report.rejected[0].to_string().starts_with(&format!("{}:2: field `answer`", path.display())));

        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "\n \n").expect("write");
        let report = qa::load(&empty);
        assert!(report.tasks.is_empty());
        assert_eq!(report.rejected.iter().map(|e| e.line).collect::<Vec<_>>(), [0]);
        assert_eq!(qa::load(&dir.path().join("missing.jsonl")).rejected.len(), 1);
    }

    #[test]
    fn bad_corpus_records_are_reported_with_their_line_and_field() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("corpus.jsonl");
        let lines = [
            r#"{"id": "a", "contents": "\"Alpha\"\nAlpha is first."}"#,
            r#"{"id": "b", "contents": "no title line"}"#,
            r#"{"contents": "\"Gamma\"\ntext"}"#,
            r#"{"id": 4, "title": "Delta", "text": "Delta is fourth."}"#,
            r#"{"id": "a", "title": "Again", "text": "dup"}"#,
            r#"{"id": "e", "title": "Epsilon"}"#,
            r#"{"id": "f", "contents": "Plain title\n  spaced text  "}"#,
        ];
        std::fs::write(&path, lines.join("\n")).expect("write");
        let (passages, errors) = qa::load_corpus(&path);
        let ids: Vec<&str> = passages.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["a", "4", "f"]);
        assert_eq!((passages[0].title.as_str(), passages[0].text.as_str()), ("Alpha", "Alpha is first."));
        assert_eq!((passages[2].title.as_str(), passages[2].text.as_str()), ("Plain title", "spaced text"));
        let located: Vec<(usize, Option<&str>)> = errors.iter().map(|e| (e.line, e.field.as_deref())).collect();
        assert_eq!(located, [(2, Some("contents")), (3, Some("id")), (5, Some("id")), (6, Some("contents"))]);
    }

    #[test]
    fn generator_is_deterministic_per_seed_and_graded_by_difficulty() {
        assert_eq!(qa::generate(30, 7, 2), qa::generate(30, 7, 2));
        assert_ne!(qa::generate(30, 7, 2), qa::generate(30, 8, 2));
        let hops = |difficulty| -> HashSet<usize> {
            qa::generate(60, 11, difficulty).iter().map(|t| payload(t).supporting_titles.len()).collect()
        };
        assert_eq!(hops(1), HashSet::from([1]));
        assert_eq!(hops(2), HashSet::from([1, 2]));
        assert_eq!(hops(3), HashSet::from([2]));
        let tasks = qa::generate(300, 5, 2);
        assert_eq!(tasks.len(), 300);
        let ids: HashSet<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        let questions: HashSet<String> = tasks.iter().map(|t| payload(t).question).collect();
        assert_eq!((ids.len(), questions.len()), (300, 300));
        assert!(qa::generate(0, 1, 1).is_empty());
    }

    #[test]
    fn generated_answers_are_retrievable_and_gold_solves() {
        let tasks = qa::generate(200, 42, 2);
        let retriever = Arc::new(Retriever::in_memory(&qa::corpus_from_tasks(&tasks)).expect("index"));
        for task in &tasks {
            let p = payload(task);
            assert_eq!(p.source, qa::Source::Generated);
            assert!(gold_solves(task, &retriever), "{}", task.id);
            let top5 = |query: &str| -> Vec<String> {
                retriever.search(query, 5).expect("search").into_iter().map(|h| h.title).collect()
            };
            assert!(top5(&p.question).contains(&p.supporting_titles[0]), "{}: first hop not in top 5", p.question);
            let answer_title = p.supporting_titles.last().expect("a supporting title");
            assert!(top5(answer_title).contains(answer_title), "{}: answer passage not found by name", p.question);
            let answer_passage = p.context.iter().find(|c| &c.title == answer_title).expect("in context");
            assert!(answer_passage.text.contains(&p.answers[0]), "{}", p.question);
        }
        let real_titles: HashSet<String> =
            hotpot_tasks().iter().flat_map(|t| payload(t).context).map(|c| c.title).collect();
        let generated_titles: HashSet<String> =
            tasks.iter().flat_map(|t| payload(t).context).map(|c| c.title).collect();
        assert!(generated_titles.is_disjoint(&real_titles));
    }

    fn round_trip(tasks: &[Task]) -> Vec<Task> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("native.jsonl");
        let mut file = std::fs::File::create(&path).expect("create");
        qa::write_native(tasks, &mut file).expect("write");
        file.flush().expect("flush");
        let report = qa::load(&path);
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        report.into_tasks()
    }

    #[test]
    fn write_native_then_load_gives_equal_tasks() {
        let generated = qa::generate(50, 9, 2);
        assert_eq!(round_trip(&generated), generated);
        let hotpot = &hotpot_tasks()[..300];
        assert_eq!(round_trip(hotpot), hotpot);
        for name in ["nq_open/NQ-open.dev.jsonl", "nq_open/flashrag_nq_test_subsample_1000.jsonl"] {
            let tasks = qa::load(&qa_file(name)).into_tasks();
            assert_eq!(round_trip(&tasks), tasks, "{name}");
        }
        let not_qa = Task { id: "m".into(), domain: Domain::Math, payload: json!({}), split: None };
        assert!(qa::write_native(&[not_qa], &mut Vec::new()).is_err());
    }

    #[test]
    fn episode_offers_budgeted_search_and_ends_on_the_answer() {
        let task = &hotpot_tasks()[0];
        let config = QaConfig { search_budget_chars: 600, ..QaConfig::default() };
        let mut episode = qa::episode(task, hotpot_retriever(), &config);
        assert_eq!(episode.observation(), payload(task).question);
        assert_eq!(episode.tools()[0].args, ["query", "k"]);
        assert!(!episode.verdict().success);

        let default_k = episode.call_tool("search", &[json!("Russian Civil War end")]).expect("search");
        let passages = default_k.as_array().expect("a list");
        assert!(!passages.is_empty() && passages.len() <= 3);
        let chars: usize = passages
            .iter()
            .map(|p| {
                p["title"].as_str().map_or(0, |s| s.chars().count())
                    + p["text"].as_str().map_or(0, |s| s.chars().count())
            })
            .sum();
        assert!(chars <= 600, "{chars}");
        let one = episode.call_tool("search", &[json!("Russian Civil War"), json!(1)]).expect("search");
        assert_eq!(one.as_array().map(Vec::len), Some(1));
        assert!(matches!(episode.call_tool("search", &[json!("x"), json!(0)]), Err(ToolError::BadArgs { .. })));
        assert!(matches!(episode.call_tool("search", &[json!(5)]), Err(ToolError::BadArgs { .. })));
        assert!(matches!(episode.call_tool("search", &[]), Err(ToolError::BadArgs { .. })));
        assert!(matches!(episode.call_tool("lookup", &[json!("x")]), Err(ToolError::Unknown(_))));

        let outcome = episode.act("in 1922");
        assert!(outcome.done && !outcome.solved && !outcome.invalid);
        assert!(episode.act("October 1922").invalid, "only one answer per episode");
        assert!(matches!(episode.call_tool("search", &[json!("x")]), Err(ToolError::Failed { .. })));

        let by_f1 = QaConfig { reward: RewardMetric::F1, ..QaConfig::default() };
        let mut partial = qa::episode(task, hotpot_retriever(), &by_f1);
        partial.act("1922");
        let verdict = partial.verdict();
        assert!(!verdict.success);
        assert!((verdict.reward - 2.0 / 3.0).abs() < 1e-12, "{}", verdict.reward);
    }

    #[test]
    fn public_view_hides_answers_and_supporting_titles() {
        let task = &hotpot_tasks()[0];
        let view = qa::public_view(task);
        assert!(view.get("answers").is_none() && view.get("supporting_titles").is_none());
        assert_eq!(view["question"], task.payload["question"]);
        assert_eq!(view["context"], task.payload["context"]);
        assert_eq!(qa::gold_actions(task), ["October 1922"]);
    }
}
