//! The chess domain: Lichess puzzles played move by move against the stored replies.
//!
//! A puzzle is a FEN before the opponent's setup move and a UCI line; the solver plays every
//! second move and the environment answers with the stored reply, accepting any checkmate, as
//! Lichess does. Real puzzles come from Lichess CSV or JSON lines; synthetic mate-in-one and
//! mate-in-two puzzles, each proved by exhaustive search, serve models too weak for real ones.
//!
//! Payload schema: `{"puzzle_id": str, "fen": str (before the setup move), "moves": [uci...],
//! "rating": int|null, "themes": [str]}`.

mod domain;
mod game;
mod generate;
mod lichess;
mod mate;
mod notation;
mod puzzle;

pub use domain::{environment, ChessDomain};
pub use game::{ChessConfig, ChessEpisode};
pub use puzzle::TaskError;

use crate::episode::Episode;
use crate::record::{LoadReport, RecordError};
use notation::{color_name, MoveText};
use puzzle::Puzzle;
use serde_json::json;
use shakmaty::fen::Fen;
use shakmaty::{EnPassantMode, Position};
use std::path::Path;
use whale_core::{Task, Verdict};

/// Loads `.csv` (with a header in any column order, or headerless `FEN,Moves,Rating` rows) or
/// JSON lines (`.jsonl`/`.json`, or any file whose first non-blank byte is `{`).
pub fn load(path: &Path) -> LoadReport {
    lichess::load(path)
}

/// Reads one JSON object keyed by the Lichess column names (`PuzzleId`, `FEN`, `Moves`, `Rating`,
/// `Themes`); `Moves` and `Themes` may be space-separated strings or arrays.
pub fn parse_record(value: &serde_json::Value, file: &Path, line: usize) -> Result<Task, RecordError> {
    lichess::parse_record(value, file, line)
}

/// `n` verified puzzles from seeded random play: difficulty 1 is mate in one, 2 mate in two
/// (other values are clamped into that range).
pub fn generate(n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
    generate::generate(n, seed, difficulty)
}

/// Writes Lichess CSV with the header `PuzzleId,FEN,Moves,Rating,Themes`, which [`load`] reads back
/// to equal tasks. A task that is not a valid chess puzzle is an `InvalidData` error.
pub fn write_native(tasks: &[Task], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    lichess::write_native(tasks, out)
}

/// The solver's moves of the stored line in UCI (empty for a task that is not a valid puzzle).
pub fn gold_actions(task: &Task) -> Vec<String> {
    Puzzle::from_task(task).map(|puzzle| puzzle.solver_moves()).unwrap_or_default()
}

/// What a solver may see: the position after the setup move, never the line.
pub fn public_view(task: &Task) -> serde_json::Value {
    let puzzle = match Puzzle::from_task(task) {
        Ok(puzzle) => puzzle,
        Err(e) => return json!({ "puzzle_id": task.id, "error": e.to_string() }),
    };
    let position = puzzle.after_setup();
    json!({
        "puzzle_id": puzzle.id,
        "fen": Fen::from_position(&position, EnPassantMode::Legal).to_string(),
        "side_to_move": color_name(position.turn()),
        "last_move": MoveText::of(&puzzle.start, puzzle.line[0]),
        "solver_moves": puzzle.solver_move_count(),
        "rating": puzzle.rating,
        "themes": puzzle.themes,
    })
}

/// A fresh episode of `task`, or why the task is not a playable puzzle.
pub fn episode(task: &Task, config: &ChessConfig) -> Result<ChessEpisode, TaskError> {
    Puzzle::from_task(task).map(|puzzle| ChessEpisode::new(puzzle, *config))
}

/// Replays `prediction` (the solver's moves in order, UCI or SAN, space-separated) through a
/// fresh episode with the default [`ChessConfig`].
pub fn score(task: &Task, prediction: &str) -> Verdict {
    let mut episode = match episode(task, &ChessConfig::default()) {
        Ok(episode) => episode,
        Err(e) => return Verdict::fail(format!("invalid chess task: {e}")),
    };
    for action in prediction.split_whitespace() {
        if episode.act(action).done {
            break;
        }
    }
    episode.verdict()
}
