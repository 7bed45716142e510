//! A validated puzzle: the one place that decides whether a FEN and a move line make a puzzle.
//!
//! Loaders, the episode, the scorer and the writer all go through [`Puzzle::validate`], so a
//! line that loads is a line that replays, and a task payload edited by hand is checked the
//! same way as a CSV row.

use serde_json::{json, Value};
use shakmaty::fen::Fen;
use shakmaty::uci::UciMove;
use shakmaty::{CastlingMode, Chess, Move, Position};
use whale_core::{Domain, Task};

/// Why a chess task (or a record about to become one) is not a playable puzzle.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskError {
    #[error("task `{id}` belongs to the {domain} domain, not chess")]
    WrongDomain { id: String, domain: Domain },
    #[error("payload field `{field}`: {reason}")]
    Payload { field: &'static str, reason: String },
    #[error("`{fen}` is not a valid chess position: {reason}")]
    Fen { fen: String, reason: String },
    #[error("move {number} `{text}`: {reason}")]
    Move {
        /// 1-based position in the line.
        number: usize,
        text: String,
        reason: String,
    },
    #[error(
        "the line has {0} moves; expected an even number, at least 2: the opponent's setup move, \
         then solver moves each answered by a reply, ending with a solver move"
    )]
    LineLength(usize),
}

impl TaskError {
    /// The Lichess column the error is about, for [`crate::RecordError`].
    pub fn column(&self) -> Option<&'static str> {
        match self {
            TaskError::WrongDomain { .. } => None,
            TaskError::Payload { field, .. } => Some(field),
            TaskError::Fen { .. } => Some("FEN"),
            TaskError::Move { .. } | TaskError::LineLength(_) => Some("Moves"),
        }
    }
}

/// A puzzle's fields as read, before any chess is checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawPuzzle {
    pub id: String,
    pub fen: String,
    pub moves: Vec<String>,
    pub rating: Option<u32>,
    pub themes: Vec<String>,
}

/// A puzzle whose FEN parses and whose whole line is legal, of even length.
#[derive(Debug, Clone)]
pub(crate) struct Puzzle {
    pub id: String,
    /// The FEN exactly as stored (before the setup move).
    pub fen: String,
    pub start: Chess,
    /// `line[0]` is the opponent's setup move; solver moves sit at odd indices.
    pub line: Vec<Move>,
    pub rating: Option<u32>,
    pub themes: Vec<String>,
}

impl Puzzle {
    pub fn validate(raw: RawPuzzle) -> Result<Puzzle, TaskError> {
        let start = parse_position(&raw.fen)?;
        let line = replay_line(&start, &raw.moves)?;
        if line.len() < 2 || line.len() % 2 != 0 {
            return Err(TaskError::LineLength(line.len()));
        }
        Ok(Puzzle { id: raw.id, fen: raw.fen, start, line, rating: raw.rating, themes: raw.themes })
    }

    pub fn from_task(task: &Task) -> Result<Puzzle, TaskError> {
        if task.domain != Domain::Chess {
            return Err(TaskError::WrongDomain { id: task.id.clone(), domain: task.domain });
        }
        Puzzle::validate(raw_from_payload(&task.id, &task.payload)?)
    }

    /// The line in standard UCI (castling as the king's two-square move).
    pub fn uci_line(&self) -> Vec<String> {
        self.line.iter().map(|&m| UciMove::from_standard(m).to_string()).collect()
    }

    /// The position after the setup move, where the solver is to move.
    pub fn after_setup(&self) -> Chess {
        let mut position = self.start.clone();
        position.play_unchecked(self.line[0]);
        position
    }

    /// The solver's moves of the line in UCI: what a perfect solver plays.
    pub fn solver_moves(&self) -> Vec<String> {
        self.uci_line().into_iter().skip(1).step_by(2).collect()
    }

    pub fn solver_move_count(&self) -> usize {
        self.line.len() / 2
    }

    pub fn into_task(self) -> Task {
        let payload = json!({
            "puzzle_id": self.id,
            "fen": self.fen,
            "moves": self.uci_line(),
            "rating": self.rating,
            "themes": self.themes,
        });
        Task { id: self.id, domain: Domain::Chess, payload, split: None }
    }
}

pub(crate) fn parse_position(fen: &str) -> Result<Chess, TaskError> {
    let invalid = |reason: String| TaskError::Fen { fen: fen.to_string(), reason };
    let parsed = Fen::from_ascii(fen.trim().as_bytes()).map_err(|e| invalid(e.to_string()))?;
    parsed.into_position(CastlingMode::Standard).map_err(|e| invalid(e.to_string()))
}

fn replay_line(start: &Chess, moves: &[String]) -> Result<Vec<Move>, TaskError> {
    let mut position = start.clone();
    let mut line = Vec::with_capacity(moves.len());
    for (index, text) in moves.iter().enumerate() {
        let bad = |reason: &str| TaskError::Move { number: index + 1, text: text.clone(), reason: reason.to_string() };
        let uci =
            UciMove::from_ascii(text.as_bytes()).map_err(|_| bad("expected a move in UCI notation (e2e4, e7e8q)"))?;
        let m = uci.to_move(&position).map_err(|_| bad("not a legal move in the position reached by the line"))?;
        position.play_unchecked(m);
        line.push(m);
    }
    Ok(line)
}

/// Reads the payload schema `{puzzle_id, fen, moves: [uci], rating: int|null, themes: [str]}`.
fn raw_from_payload(task_id: &str, payload: &Value) -> Result<RawPuzzle, TaskError> {
    let bad = |field: &'static str, reason: &str| TaskError::Payload { field, reason: reason.to_string() };
    let id = match payload.get("puzzle_id") {
        None | Some(Value::Null) => task_id.to_string(),
        Some(value) => value.as_str().ok_or_else(|| bad("puzzle_id", "expected a string"))?.to_string(),
    };
    let fen = payload.get("fen").and_then(Value::as_str).ok_or_else(|| bad("fen", "expected a FEN string"))?;
    let moves = payload
        .get("moves")
        .and_then(string_array)
        .ok_or_else(|| bad("moves", "expected an array of UCI move strings"))?;
    let rating = match payload.get("rating") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or_else(|| bad("rating", "expected a non-negative integer or null"))?,
        ),
    };
    let themes = match payload.get("themes") {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => string_array(value).ok_or_else(|| bad("themes", "expected an array of strings"))?,
    };
    Ok(RawPuzzle { id, fen: fen.to_string(), moves, rating, themes })
}

fn string_array(value: &Value) -> Option<Vec<String>> {
    value.as_array()?.iter().map(|v| v.as_str().map(str::to_string)).collect()
}
