//! The chess domain against the real Lichess puzzles in shared/data and against generated ones.

use serde_json::{json, Value};
use shakmaty::fen::Fen;
use shakmaty::san::SanPlus;
use shakmaty::uci::UciMove;
use shakmaty::{CastlingMode, Chess, EnPassantMode, Move, Position};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use whale_core::{Domain, Task};
use whale_tasks::chess::{self, ChessConfig};
use whale_tasks::{Episode, LoadReport, RecordError};

const SHARED_FILES: [(&str, usize); 2] =
    [("kagi_llm_chess_puzzles.csv", 1000), ("darlinx25_chess_practice_puzzles.csv", 1499)];

fn shared_data() -> PathBuf {
    let relative = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if relative.is_dir() {
        return relative;
    }
    PathBuf::from(std::env::var("WHALE_SHARED_DATA").expect("shared data: set WHALE_SHARED_DATA"))
}

fn shared_file(name: &str) -> PathBuf {
    shared_data().join("chess").join(name)
}

/// Every shared puzzle, loaded once.
fn shared_tasks() -> &'static Vec<Task> {
    static TASKS: OnceLock<Vec<Task>> = OnceLock::new();
    TASKS.get_or_init(|| {
        SHARED_FILES.iter().flat_map(|(name, _)| chess::load(&shared_file(name)).into_tasks()).collect()
    })
}

fn position(fen: &str) -> Chess {
    let parsed: Fen = fen.parse().expect("FEN parses");
    parsed.into_position(CastlingMode::Standard).expect("legal position")
}

fn uci_move(position: &Chess, text: &str) -> Move {
    let uci: UciMove = text.parse().expect("UCI parses");
    uci.to_move(position).expect("legal UCI move")
}

fn uci_of(m: Move) -> String {
    UciMove::from_standard(m).to_string()
}

fn payload_moves(task: &Task) -> Vec<String> {
    task.payload["moves"].as_array().expect("moves").iter().map(|m| m.as_str().expect("uci").to_string()).collect()
}

/// The position after the setup move, replayed with shakmaty alone.
fn solver_start(task: &Task) -> Chess {
    let mut pos = position(task.payload["fen"].as_str().expect("fen"));
    let setup = uci_move(&pos, &payload_moves(task)[0]);
    pos.play_unchecked(setup);
    pos
}

fn mates(pos: &Chess) -> Vec<Move> {
    pos.legal_moves()
        .into_iter()
        .filter(|&m| {
            let mut next = pos.clone();
            next.play_unchecked(m);
            next.is_checkmate()
        })
        .collect()
}

fn write_temp(contents: &[u8], suffix: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().prefix("chess-test-").suffix(suffix).tempfile().expect("temp file");
    file.write_all(contents).expect("write temp file");
    file
}

fn load_bytes(contents: &[u8], suffix: &str) -> (LoadReport, tempfile::NamedTempFile) {
    let file = write_temp(contents, suffix);
    (chess::load(file.path()), file)
}

fn play_all(task: &Task, actions: &[String]) -> whale_core::Verdict {
    let mut episode = chess::episode(task, &ChessConfig::default()).expect("valid task");
    for action in actions {
        let outcome = episode.act(action);
        assert!(!outcome.invalid, "{}: `{action}` rejected: {}", task.id, outcome.reply);
    }
    assert!(episode.is_done(), "{}: episode not over after the gold line", task.id);
    episode.verdict()
}

#[test]
fn every_shared_puzzle_loads_without_rejection() {
    for (name, expected) in SHARED_FILES {
        let report = chess::load(&shared_file(name));
        assert!(report.rejected.is_empty(), "{name}: {:?}", &report.rejected[..report.rejected.len().min(5)]);
        assert_eq!(report.tasks.len(), expected, "{name}");
        let (line, task) = &report.tasks[0];
        assert_eq!(*line, 2, "the first record sits under the header");
        assert_eq!(task.domain, Domain::Chess);
        assert_eq!(task.id, task.payload["puzzle_id"]);
    }
    let first = &chess::load(&shared_file("kagi_llm_chess_puzzles.csv")).tasks[0].1;
    assert_eq!(first.id, "tewjc");
    assert_eq!(first.payload["fen"], "r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19");
    assert_eq!(first.payload["rating"], 1493);
    assert_eq!(first.payload["themes"][0], "crushing");
    assert_eq!(payload_moves(first), ["a2a7", "e5e3", "f2e3", "f6a1", "a7a1", "a8a1"]);
}

#[test]
fn every_shared_puzzle_is_solved_by_its_gold_line_in_uci_and_san() {
    let tasks = shared_tasks();
    assert_eq!(tasks.len(), 2499);
    for task in tasks {
        let gold = chess::gold_actions(task);
        assert_eq!(gold.len(), payload_moves(task).len() / 2);
        let verdict = play_all(task, &gold);
        assert!(verdict.success && verdict.reward == 1.0, "{}: {}", task.id, verdict.detail);
        let san = gold_in_san(task);
        let verdict = chess::score(task, &san.join(" "));
        assert!(verdict.success, "{} in SAN {san:?}: {}", task.id, verdict.detail);
    }
}

/// The solver's moves in SAN with check suffixes, computed with shakmaty alone.
fn gold_in_san(task: &Task) -> Vec<String> {
    let mut pos = position(task.payload["fen"].as_str().expect("fen"));
    let mut san = Vec::new();
    for (index, text) in payload_moves(task).iter().enumerate() {
        let m = uci_move(&pos, text);
        let written = SanPlus::from_move_and_play_unchecked(&mut pos, m);
        if index % 2 == 1 {
            san.push(written.to_string());
        }
    }
    san
}

#[test]
fn a_legal_wrong_move_fails_the_puzzle() {
    let mut checked = 0;
    for task in shared_tasks() {
        let start = solver_start(task);
        let expected = uci_move(&start, &chess::gold_actions(task)[0]);
        let mating = mates(&start);
        let Some(wrong) = start.legal_moves().into_iter().find(|&m| m != expected && !mating.contains(&m)) else {
            continue;
        };
        let mut episode = chess::episode(task, &ChessConfig::default()).expect("valid");
        let outcome = episode.act(&uci_of(wrong));
        assert!(outcome.done && !outcome.solved && !outcome.invalid, "{}: {}", task.id, outcome.reply);
        let verdict = episode.verdict();
        assert_eq!(verdict.reward, 0.0);
        assert!(!verdict.success);
        checked += 1;
    }
    assert!(checked > 2400, "only {checked} puzzles had a wrong legal move");
}

#[test]
fn another_mating_move_solves_a_mate_puzzle() {
    let alternative = shared_tasks().iter().find_map(|task| {
        let gold = chess::gold_actions(task);
        if gold.len() != 1 {
            return None;
        }
        let start = solver_start(task);
        let other = mates(&start).into_iter().find(|&m| uci_of(m) != gold[0])?;
        Some((task, uci_of(other)))
    });
    let (task, other) = alternative.expect("the shared data holds a mate in one with two mating moves");
    let verdict = chess::score(task, &other);
    assert!(verdict.success, "{} with {other}: {}", task.id, verdict.detail);
    assert!(verdict.detail.contains("another mate"), "{}", verdict.detail);
}

/// A hand-built mate in one where either rook mates on the back rank.
fn two_rook_task() -> Task {
    let fen = "6k1/5ppp/8/8/7p/8/7P/R3R1K1 b - - 0 1";
    let record = json!({"PuzzleId": "rooks", "FEN": fen, "Moves": "h4h3 a1a8"});
    chess::parse_record(&record, Path::new("hand.jsonl"), 1).expect("valid hand-made puzzle")
}

#[test]
fn either_back_rank_mate_solves_the_hand_built_puzzle() {
    let task = two_rook_task();
    for solution in ["a1a8", "Ra8#", "e1e8", "Re8"] {
        let verdict = chess::score(&task, solution);
        assert!(verdict.success, "{solution}: {}", verdict.detail);
    }
    assert!(!chess::score(&task, "Ra7").success);
}

#[test]
fn illegal_and_malformed_moves_have_separate_retries() {
    let task = two_rook_task();
    assert!(chess::score(&task, "a1a9x e1e8").success, "one malformed move is forgiven");
    assert!(chess::score(&task, "e1e7e a1b8 e1e8").success, "one of each kind is forgiven");
    assert!(!chess::score(&task, "hello world e1e8").success, "two malformed moves fail");

    let mut episode = chess::episode(&task, &ChessConfig::default()).expect("valid");
    let first = episode.act("a1a7a");
    assert!(first.invalid && !first.done);
    let illegal = episode.act("e1f2");
    assert!(illegal.invalid && !illegal.done, "{}", illegal.reply);
    let second_illegal = episode.act("Kg3");
    assert!(second_illegal.invalid && second_illegal.done && !second_illegal.solved);
    assert_eq!(episode.verdict().reward, 0.0);

    let strict = ChessConfig { malformed_retries: 0, illegal_retries: 3 };
    let mut episode = chess::episode(&task, &strict).expect("valid");
    assert!(episode.act("nonsense").done);
    assert!(!episode.verdict().success);
}

#[test]
fn an_illegal_move_then_the_solution_passes_but_two_illegal_moves_fail() {
    let task = shared_tasks().iter().find(|t| chess::gold_actions(t).len() >= 2).expect("a longer puzzle");
    let illegal = "a1a1";
    let mut episode = chess::episode(task, &ChessConfig::default()).expect("valid");
    let outcome = episode.act(illegal);
    assert!(outcome.invalid && !outcome.done, "{}", outcome.reply);
    let gold = chess::gold_actions(task);
    let with_one = format!("{illegal} {}", gold.join(" "));
    assert!(chess::score(task, &with_one).success);
    let with_two = format!("{illegal} {illegal} {}", gold.join(" "));
    let verdict = chess::score(task, &with_two);
    assert!(!verdict.success && verdict.reward == 0.0, "{}", verdict.detail);
}

#[test]
fn replies_and_tools_follow_the_stored_line() {
    let task = shared_tasks().iter().find(|t| chess::gold_actions(t).len() >= 2).expect("a longer puzzle");
    let moves = payload_moves(task);
    let mut episode = chess::episode(task, &ChessConfig::default()).expect("valid");
    let start = solver_start(task);
    assert!(episode.observation().contains(&Fen::from_position(&start, EnPassantMode::Legal).to_string()));
    assert_eq!(episode.call_tool("last_move", &[]).expect("tool")["uci"], moves[0].as_str());

    let legal = episode.call_tool("legal_moves", &[]).expect("tool");
    assert_eq!(legal["uci"].as_array().expect("uci").len(), start.legal_moves().len());
    assert_eq!(legal["san"].as_array().expect("san").len(), start.legal_moves().len());
    let side = if start.turn().is_white() { "white" } else { "black" };
    assert_eq!(episode.call_tool("side_to_move", &[]).expect("tool"), side);
    let board = episode.call_tool("board", &[]).expect("tool");
    assert_eq!(board.as_str().expect("text").lines().count(), 9);
    assert!(episode.call_tool("fen", &[json!(1)]).is_err());
    assert!(episode.call_tool("engine", &[]).is_err());

    let outcome = episode.act(&moves[1]);
    assert!(!outcome.done && !outcome.invalid);
    let mut after_reply = start.clone();
    after_reply.play_unchecked(uci_move(&start, &moves[1]));
    let reply = uci_move(&after_reply, &moves[2]);
    let reply_san = SanPlus::from_move(after_reply.clone(), reply).to_string();
    assert!(outcome.reply.contains(&moves[2]) && outcome.reply.contains(&reply_san), "{}", outcome.reply);
    let last = episode.call_tool("last_move", &[]).expect("tool");
    assert_eq!(last, json!({"uci": moves[2], "san": reply_san}));
    after_reply.play_unchecked(reply);
    assert_eq!(
        episode.call_tool("fen", &[]).expect("tool"),
        Fen::from_position(&after_reply, EnPassantMode::Legal).to_string()
    );
    assert!(!episode.verdict().success, "an unfinished episode fails");
}

#[test]
fn public_view_hides_the_line() {
    let task = &shared_tasks()[0];
    let view = chess::public_view(task);
    let text = view.to_string();
    let moves = payload_moves(task);
    for solver_move in moves.iter().skip(1).step_by(2) {
        assert!(!text.contains(solver_move.as_str()), "{solver_move} leaks into {text}");
    }
    let start = solver_start(task);
    assert_eq!(view["fen"], Fen::from_position(&start, EnPassantMode::Legal).to_string());
    assert_eq!(view["last_move"]["uci"], moves[0].as_str());
    assert_eq!(view["rating"], task.payload["rating"]);
}

/// The first `n` records of a shared file as (PuzzleId, FEN, Moves, Rating, Themes).
fn shared_rows(n: usize) -> Vec<[String; 5]> {
    let mut reader = csv::Reader::from_path(shared_file("kagi_llm_chess_puzzles.csv")).expect("shared csv");
    reader
        .records()
        .take(n)
        .map(|r| {
            let r = r.expect("record");
            [0, 1, 2, 3, 7].map(|i| r[i].to_string())
        })
        .collect()
}

fn payload_core(task: &Task) -> (Value, Value, Value) {
    (task.payload["fen"].clone(), task.payload["moves"].clone(), task.payload["rating"].clone())
}

#[test]
fn headerless_rows_load_with_ids_from_file_and_line() {
    let rows = shared_rows(40);
    let text: String = rows.iter().map(|r| format!("{},{},{}\n", r[1], r[2], r[3])).collect();
    let (report, file) = load_bytes(text.as_bytes(), ".csv");
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    let reference = &shared_tasks()[..40];
    assert_eq!(report.tasks.len(), 40);
    let stem = file.path().file_stem().expect("stem").to_string_lossy().to_string();
    for (index, ((line, task), original)) in report.tasks.iter().zip(reference).enumerate() {
        assert_eq!(*line, index + 1);
        assert_eq!(task.id, format!("{stem}-{line}"));
        assert_eq!(payload_core(task), payload_core(original));
    }
}

#[test]
fn jsonl_loads_with_moves_as_string_or_array() {
    let rows = shared_rows(30);
    let mut text = String::new();
    for (index, r) in rows.iter().enumerate() {
        let moves: Value = if index % 2 == 0 { json!(r[2]) } else { json!(r[2].split(' ').collect::<Vec<_>>()) };
        let rating: Value = if index % 3 == 0 { json!(r[3]) } else { json!(r[3].parse::<u32>().expect("rating")) };
        let record = json!({"PuzzleId": r[0], "FEN": r[1], "Moves": moves, "Rating": rating, "Themes": r[4]});
        text.push_str(&format!("{record}\n\n"));
    }
    for suffix in [".jsonl", ".txt"] {
        let (report, _file) = load_bytes(text.as_bytes(), suffix);
        assert!(report.rejected.is_empty(), "{suffix}: {:?}", report.rejected);
        assert_eq!(report.tasks.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>(), shared_tasks()[..30]);
        assert_eq!(report.tasks[1].0, 3, "blank lines still count");
    }
}

#[test]
fn a_reordered_header_loads_the_same_tasks() {
    let source = std::fs::read_to_string(shared_file("darlinx25_chess_practice_puzzles.csv")).expect("read");
    let mut reader = csv::Reader::from_reader(source.as_bytes());
    let header = reader.headers().expect("header").clone();
    let order = [7, 3, 2, 10, 0, 1, 4, 5, 6, 8, 9];
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(order.map(|i| &header[i])).expect("header");
    for record in reader.records().take(100) {
        let record = record.expect("record");
        writer.write_record(order.map(|i| &record[i])).expect("record");
    }
    let bytes = writer.into_inner().expect("csv bytes");
    let (report, _file) = load_bytes(&bytes, ".csv");
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    let expected = chess::load(&shared_file("darlinx25_chess_practice_puzzles.csv")).into_tasks();
    assert_eq!(report.into_tasks(), expected[..100]);
}

fn error_at(report: &LoadReport, line: usize) -> &RecordError {
    report
        .rejected
        .iter()
        .find(|e| e.line == line)
        .unwrap_or_else(|| panic!("no error at line {line}: {:?}", report.rejected))
}

#[test]
fn every_bad_record_is_reported_and_the_good_ones_load() {
    let good = "0kDWS,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5 b4b5 b8b7 b5b7,1947,endgame pin";
    let mut bytes = b"PuzzleId,FEN,Moves,Rating,Themes\n".to_vec();
    let lines: [&[u8]; 8] = [
        good.as_bytes(),
        b"bad1,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/9 b - - 0 49,e3d5 b4b5,1947,x",
        b"bad2,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5 b4c5,1947,x",
        b"bad3,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5,1947,x",
        b"bad4,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5 b4b5,high,x",
        b"bad5,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5 b4b5,1947,endgame \xff",
        b"bad6,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5 b4b5 b8b7,1947,x",
        b"bad7,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49",
    ];
    for line in lines {
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(format!("{}\n", good.replace("0kDWS", "again")).as_bytes());
    let (report, _file) = load_bytes(&bytes, ".csv");
    assert_eq!(
        report.tasks.iter().map(|(line, t)| (*line, t.id.as_str())).collect::<Vec<_>>(),
        [(2, "0kDWS"), (10, "again")]
    );
    assert_eq!(report.rejected.len(), 7, "{:?}", report.rejected);
    let expect = [(3, "FEN"), (4, "Moves"), (5, "Moves"), (6, "Rating"), (7, "Themes"), (8, "Moves"), (9, "Moves")];
    for (line, field) in expect {
        let error = error_at(&report, line);
        assert_eq!(error.field.as_deref(), Some(field), "line {line}: {error}");
        assert!(error.to_string().starts_with(&format!("{}:{line}: field `{field}`", error.file.display())));
    }
    assert!(error_at(&report, 4).reason.contains("move 2 `b4c5`"), "{}", error_at(&report, 4));
    assert!(error_at(&report, 5).reason.contains("has 1 moves"), "{}", error_at(&report, 5));
    assert!(error_at(&report, 6).reason.contains("`high`"), "{}", error_at(&report, 6));
    assert!(error_at(&report, 7).reason.contains("UTF-8"), "{}", error_at(&report, 7));
    assert!(error_at(&report, 9).reason.contains("missing"), "{}", error_at(&report, 9));
}

#[test]
fn whole_file_problems_are_reported() {
    let (report, _file) = load_bytes(b"PuzzleId,FEN,Rating\nx,8/8/8/8/8/8/8/K1k5 w - - 0 1,1000\n", ".csv");
    assert!(report.tasks.is_empty());
    assert_eq!(report.rejected.len(), 1);
    assert_eq!((report.rejected[0].line, report.rejected[0].field.as_deref()), (1, Some("Moves")));

    for (contents, suffix) in [(&b""[..], ".csv"), (b"  \n\n", ".jsonl"), (b"PuzzleId,FEN,Moves\n", ".csv")] {
        let (report, _file) = load_bytes(contents, suffix);
        assert!(report.tasks.is_empty());
        assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
        assert_eq!(report.rejected[0].line, 0);
    }
    let missing = chess::load(Path::new("/nonexistent/puzzles.csv"));
    assert_eq!((missing.tasks.len(), missing.rejected[0].line), (0, 0));
}

#[test]
fn bad_json_records_name_their_field() {
    let fen = "6k1/5ppp/8/8/7p/8/7P/R3R1K1 b - - 0 1";
    let text = [
        json!({"FEN": fen, "Moves": ["h4h3", "a1a8"], "Rating": 900}).to_string(),
        json!({"FEN": fen}).to_string(),
        json!({"FEN": fen, "Moves": "h4h3 a1a8", "Rating": -3}).to_string(),
        json!({"FEN": fen, "Moves": [1, 2]}).to_string(),
        "{not json".to_string(),
        json!({"Moves": "h4h3 a1a8"}).to_string(),
    ]
    .join("\n");
    let (report, file) = load_bytes(text.as_bytes(), ".jsonl");
    let stem = file.path().file_stem().expect("stem").to_string_lossy().to_string();
    assert_eq!(report.tasks.len(), 1);
    assert_eq!(report.tasks[0].1.id, format!("{stem}-1"));
    let fields: Vec<(usize, Option<&str>)> = report.rejected.iter().map(|e| (e.line, e.field.as_deref())).collect();
    assert_eq!(fields, [(2, Some("Moves")), (3, Some("Rating")), (4, Some("Moves")), (5, None), (6, Some("FEN"))]);
}

#[test]
fn a_puzzle_id_used_twice_is_rejected_at_its_second_line() {
    let good = "0kDWS,1r6/1PN5/3p4/4kpp1/1R6/P3n3/K1P5/8 b - - 0 49,e3d5 b4b5 b8b7 b5b7,1947,endgame pin";
    let bytes = format!("PuzzleId,FEN,Moves,Rating,Themes\n{good}\n{good}\n");
    let (report, _file) = load_bytes(bytes.as_bytes(), ".csv");
    assert_eq!(report.tasks.iter().map(|(line, _)| *line).collect::<Vec<_>>(), [2]);
    let error = error_at(&report, 3);
    assert_eq!(error.field.as_deref(), Some("PuzzleId"), "{error}");
    assert!(error.reason.contains("duplicate id `0kDWS` (first used on line 2)"), "{error}");
}

#[test]
fn json_with_a_byte_order_mark_or_as_an_array_loads() {
    let fen = "6k1/5ppp/8/8/7p/8/7P/R3R1K1 b - - 0 1";
    let record = |id: &str| json!({"PuzzleId": id, "FEN": fen, "Moves": "h4h3 a1a8"});
    let lines = format!("\u{feff}{}\r\n{}\r\n", record("a"), record("b"));
    let array = format!("\u{feff}[\n{},\n{}\n]", record("a"), record("b"));
    let cases = [(lines.as_str(), ".jsonl", 1), (&lines, ".txt", 1), (&array, ".json", 2), (&array, ".txt", 2)];
    for (text, suffix, first) in cases {
        let (report, _file) = load_bytes(text.as_bytes(), suffix);
        assert!(report.rejected.is_empty(), "{suffix}: {:?}", report.rejected);
        let loaded: Vec<(usize, &str)> = report.tasks.iter().map(|(line, t)| (*line, t.id.as_str())).collect();
        assert_eq!(loaded, [(first, "a"), (first + 1, "b")], "{suffix}");
    }
}

#[test]
fn shared_puzzles_survive_a_native_round_trip() {
    let tasks = shared_tasks();
    let mut bytes = Vec::new();
    chess::write_native(tasks, &mut bytes).expect("write");
    assert!(bytes.starts_with(b"PuzzleId,FEN,Moves,Rating,Themes\n"));
    let (report, _file) = load_bytes(&bytes, ".csv");
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    assert_eq!(&report.into_tasks(), tasks);
}

#[test]
fn invalid_tasks_are_refused_not_panicked_on() {
    let mut task = shared_tasks()[0].clone();
    task.payload["moves"] = json!(["a2a7", "e5d4"]);
    assert!(chess::episode(&task, &ChessConfig::default()).is_err());
    assert!(!chess::score(&task, "e5d4").success);
    assert!(chess::gold_actions(&task).is_empty());
    assert!(chess::public_view(&task).get("error").is_some());
    let mut sink = Vec::new();
    let error = chess::write_native(&[task], &mut sink).expect_err("invalid task");
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
}

/// Checks a generated mate in `depth` with shakmaty alone.
fn assert_real_mate(task: &Task, depth: usize) {
    let moves = payload_moves(task);
    assert_eq!(moves.len(), 2 * depth, "{}", task.id);
    let start = solver_start(task);
    assert!(!start.is_game_over());
    let mut pos = start.clone();
    for text in &moves[1..] {
        let m = uci_move(&pos, text);
        pos.play_unchecked(m);
    }
    assert!(pos.is_checkmate(), "{}: the line does not end in mate", task.id);
    if depth == 2 {
        assert!(mates(&start).is_empty(), "{}: has a mate in one", task.id);
        let mut defended = start.clone();
        defended.play_unchecked(uci_move(&start, &moves[1]));
        let replies = defended.legal_moves();
        assert!(!replies.is_empty());
        for reply in replies {
            let mut answer = defended.clone();
            answer.play_unchecked(reply);
            assert!(!mates(&answer).is_empty(), "{}: {} escapes", task.id, uci_of(reply));
        }
    }
}

#[test]
fn generated_mates_are_real_and_gold_solves_them() {
    for (difficulty, count, seed) in [(1u32, 200usize, 11u64), (2, 50, 12), (3, 100, 11), (4, 30, 12)] {
        let depth = if difficulty % 2 == 1 { 1 } else { 2 };
        let tasks = chess::generate(count, seed, difficulty);
        assert_eq!(tasks.len(), count);
        let mut fens: Vec<&str> = tasks.iter().map(|t| t.payload["fen"].as_str().expect("fen")).collect();
        fens.sort_unstable();
        fens.dedup();
        assert_eq!(fens.len(), count, "duplicate puzzles");
        for task in &tasks {
            assert_real_mate(task, depth);
            let verdict = play_all(task, &chess::gold_actions(task));
            assert!(verdict.success, "{}: {}", task.id, verdict.detail);
            assert!(task.payload["themes"].as_array().expect("themes").contains(&json!(format!("mateIn{depth}"))));
            assert!(task.payload["rating"].as_u64().is_some());
        }
        let mut bytes = Vec::new();
        chess::write_native(&tasks, &mut bytes).expect("write");
        let (report, _file) = load_bytes(&bytes, ".csv");
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        assert_eq!(report.into_tasks(), tasks);
    }
}

#[test]
fn generation_is_deterministic_per_seed() {
    assert_eq!(chess::generate(10, 5, 1), chess::generate(10, 5, 1));
    assert_ne!(chess::generate(10, 5, 1), chess::generate(10, 6, 1));
    assert_eq!(chess::generate(3, 5, 2), chess::generate(3, 5, 2));
    assert_eq!(chess::generate(4, 9, 7), chess::generate(4, 9, 4), "difficulty is clamped to 4");
    assert_eq!(chess::generate(2, 9, 0), chess::generate(2, 9, 1), "and to 1");
}

#[test]
fn endgames_are_sparse_and_random_play_is_not() {
    let pieces = |task: &whale_core::Task| {
        let fen = task.payload["fen"].as_str().expect("fen");
        fen.split(' ').next().expect("placement").chars().filter(char::is_ascii_alphabetic).count()
    };
    for difficulty in [1, 2] {
        assert!(chess::generate(40, 3, difficulty).iter().all(|t| pieces(t) <= 6 && t.id.starts_with("gen-e")));
    }
    let middlegame = chess::generate(40, 3, 3);
    let mean = middlegame.iter().map(pieces).sum::<usize>() as f64 / 40.0;
    assert!(mean > 12.0, "{mean} pieces on average");
}
