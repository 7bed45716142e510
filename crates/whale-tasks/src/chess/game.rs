//! A puzzle played move by move against the stored line, as on Lichess.
//!
//! The setup move is already on the board when the episode starts. Each solver move is checked
//! against the stored one and answered with the stored reply; any checkmate is accepted, since a
//! mate ends the game however it was found. Malformed and illegal moves do not count as moves
//! and have their own retry budgets, so a model that garbles notation is told so before it fails.

use super::notation::{ascii_board, color_name, parse_move, MoveRejection, MoveText};
use super::puzzle::Puzzle;
use crate::episode::{Episode, StepOutcome, ToolError, ToolSpec};
use serde_json::{json, Value};
use shakmaty::fen::Fen;
use shakmaty::{Chess, EnPassantMode, Move, Position};
use whale_core::Verdict;

/// How forgiving an episode is with moves that are not moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChessConfig {
    /// Unparseable moves tolerated before the episode fails.
    pub malformed_retries: u32,
    /// Well-formed but illegal moves tolerated before the episode fails.
    pub illegal_retries: u32,
}

impl Default for ChessConfig {
    fn default() -> Self {
        Self { malformed_retries: 1, illegal_retries: 1 }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Playing,
    Solved(String),
    Failed(String),
}

/// One puzzle in play.
#[derive(Debug, Clone)]
pub struct ChessEpisode {
    puzzle: Puzzle,
    config: ChessConfig,
    position: Chess,
    /// Index in `puzzle.line` of the solver move expected next.
    next: usize,
    last_move: MoveText,
    malformed: u32,
    illegal: u32,
    status: Status,
}

impl ChessEpisode {
    pub(crate) fn new(puzzle: Puzzle, config: ChessConfig) -> ChessEpisode {
        let last_move = MoveText::of(&puzzle.start, puzzle.line[0]);
        let position = puzzle.after_setup();
        ChessEpisode { puzzle, config, position, next: 1, last_move, malformed: 0, illegal: 0, status: Status::Playing }
    }

    /// The current position in FEN.
    pub fn fen(&self) -> String {
        Fen::from_position(&self.position, EnPassantMode::Legal).to_string()
    }

    fn side_to_move(&self) -> &'static str {
        color_name(self.position.turn())
    }

    /// Legal moves sorted by UCI, with the SAN of each at the same index.
    fn legal_moves(&self) -> Value {
        let mut moves: Vec<MoveText> =
            self.position.legal_moves().into_iter().map(|m| MoveText::of(&self.position, m)).collect();
        moves.sort_by(|a, b| a.uci.cmp(&b.uci));
        let (uci, san): (Vec<String>, Vec<String>) = moves.into_iter().map(|t| (t.uci, t.san)).unzip();
        json!({ "uci": uci, "san": san })
    }

    fn outcome(&self, reply: String, invalid: bool) -> StepOutcome {
        StepOutcome { reply, invalid, done: self.is_done(), solved: matches!(self.status, Status::Solved(_)) }
    }

    fn reject(&mut self, action: &str, rejection: MoveRejection) -> StepOutcome {
        let (count, allowed, what) = match rejection {
            MoveRejection::Malformed => {
                self.malformed += 1;
                (self.malformed, self.config.malformed_retries, "is not a move in UCI (e2e4) or SAN (Nf3)")
            }
            MoveRejection::Illegal => {
                self.illegal += 1;
                (self.illegal, self.config.illegal_retries, "is not a legal move in this position")
            }
        };
        let problem = format!("`{}` {what}", action.trim());
        if count > allowed {
            self.status = Status::Failed(format!("{problem}; no retries left"));
            return self.outcome(format!("{problem}; no retries left, puzzle failed"), true);
        }
        let left = allowed - count;
        self.outcome(format!("{problem}; {left} such retries left"), true)
    }

    fn play_solver_move(&mut self, m: Move) -> StepOutcome {
        let expected = self.puzzle.line[self.next];
        let played = MoveText::of(&self.position, m);
        let stored = MoveText::of(&self.position, expected);
        self.position.play_unchecked(m);
        self.last_move = played.clone();
        if self.position.is_checkmate() {
            let how = if m == expected { "the stored mate" } else { "a checkmate (another mate than the stored one)" };
            self.status = Status::Solved(format!("{played} is {how}"));
            return self.outcome(format!("correct: {played} is checkmate; puzzle solved"), false);
        }
        if m != expected {
            self.status = Status::Failed(format!("move {} was {played}, the solution is {stored}", self.next / 2 + 1));
            return self.outcome(format!("{played} is legal but not the solution; puzzle failed"), false);
        }
        if self.next + 1 == self.puzzle.line.len() {
            self.status = Status::Solved(format!("all {} solver moves played", self.puzzle.solver_move_count()));
            return self.outcome(format!("correct: {played}; puzzle solved"), false);
        }
        let reply_move = self.puzzle.line[self.next + 1];
        let reply = MoveText::of(&self.position, reply_move);
        self.position.play_unchecked(reply_move);
        self.last_move = reply.clone();
        self.next += 2;
        self.outcome(format!("correct: {played}; opponent replied {reply}"), false)
    }

    fn run_tool(&self, tool: Tool) -> Value {
        match tool {
            Tool::LegalMoves => self.legal_moves(),
            Tool::Fen => Value::String(self.fen()),
            Tool::Board => Value::String(ascii_board(&self.position)),
            Tool::SideToMove => Value::String(self.side_to_move().to_string()),
            Tool::LastMove => json!(self.last_move),
        }
    }
}

/// The episode's tools; none takes arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    LegalMoves,
    Fen,
    Board,
    SideToMove,
    LastMove,
}

impl Tool {
    const ALL: [Tool; 5] = [Tool::LegalMoves, Tool::Fen, Tool::Board, Tool::SideToMove, Tool::LastMove];

    fn name(self) -> &'static str {
        match self {
            Tool::LegalMoves => "legal_moves",
            Tool::Fen => "fen",
            Tool::Board => "board",
            Tool::SideToMove => "side_to_move",
            Tool::LastMove => "last_move",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Tool::LegalMoves => {
                "The legal moves of the side to move as {uci: [...], san: [...]}, sorted by UCI; \
                 the same index is the same move."
            }
            Tool::Fen => "The current position in FEN.",
            Tool::Board => {
                "The current board as text: ranks 8 to 1, white pieces upper case, '.' for empty, \
                 file letters below."
            }
            Tool::SideToMove => "The side to move: \"white\" or \"black\".",
            Tool::LastMove => "The last move played as {uci, san}: the opponent's reply while the puzzle goes on.",
        }
    }

    fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|tool| tool.name() == name)
    }
}

impl Episode for ChessEpisode {
    fn observation(&self) -> String {
        let rating = self.puzzle.rating.map_or_else(|| "unrated".to_string(), |r| format!("rating {r}"));
        format!(
            "Chess puzzle {} ({rating}).\nPosition (FEN): {}\nSide to move: {}\nOpponent's last move: {}\n\
             Board:\n{}",
            self.puzzle.id,
            self.fen(),
            self.side_to_move(),
            self.last_move,
            ascii_board(&self.position)
        )
    }

    fn tools(&self) -> Vec<ToolSpec> {
        Tool::ALL
            .into_iter()
            .map(|tool| ToolSpec {
                name: tool.name().to_string(),
                description: tool.description().to_string(),
                args: Vec::new(),
            })
            .collect()
    }

    fn call_tool(&mut self, name: &str, args: &[Value]) -> Result<Value, ToolError> {
        let tool = Tool::from_name(name).ok_or_else(|| ToolError::Unknown(name.to_string()))?;
        if !args.is_empty() {
            let reason = format!("takes no arguments, got {}", args.len());
            return Err(ToolError::BadArgs { tool: name.to_string(), reason });
        }
        Ok(self.run_tool(tool))
    }

    fn act(&mut self, action: &str) -> StepOutcome {
        if self.is_done() {
            return self.outcome("the puzzle is already over".to_string(), true);
        }
        match parse_move(&self.position, action) {
            Ok(m) => self.play_solver_move(m),
            Err(rejection) => self.reject(action, rejection),
        }
    }

    fn is_done(&self) -> bool {
        self.status != Status::Playing
    }

    fn verdict(&self) -> Verdict {
        match &self.status {
            Status::Solved(detail) => Verdict::pass(detail.clone()),
            Status::Failed(detail) => Verdict::fail(detail.clone()),
            Status::Playing => Verdict::fail(format!(
                "unfinished: {} of {} solver moves played",
                self.next / 2,
                self.puzzle.solver_move_count()
            )),
        }
    }
}
