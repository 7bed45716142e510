//! Reading a solver's move and writing moves and boards back as text.
//!
//! Models write moves in UCI (`e2e4`, `e7e8q`, castling as `e1g1`) or SAN (`Nf3`, `exd5`,
//! `O-O`, `e8=Q+`). The episode must tell a string that is no move at all (malformed) from a
//! well-formed move that is not legal here (illegal): they have separate retry budgets.

use serde::Serialize;
use shakmaty::san::SanPlus;
use shakmaty::uci::UciMove;
use shakmaty::{Chess, Color, File, Move, Position, Rank, Square};

/// Why a move string was not accepted as a move in the position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MoveRejection {
    /// Neither UCI nor SAN.
    Malformed,
    /// Well-formed, but not (or not uniquely) a legal move here.
    Illegal,
}

/// Parses `text` as UCI first, then as SAN, against `position`.
pub(crate) fn parse_move(position: &Chess, text: &str) -> Result<Move, MoveRejection> {
    let text = text.trim().trim_end_matches(['!', '?']);
    if let Ok(uci) = UciMove::from_ascii(text.as_bytes()) {
        return uci.to_move(position).map_err(|_| MoveRejection::Illegal);
    }
    let san_text = castling_with_letters(text);
    let san = SanPlus::from_ascii(san_text.as_bytes()).map_err(|_| MoveRejection::Malformed)?;
    san.san.to_move(position).map_err(|_| MoveRejection::Illegal)
}

/// `0-0` / `0-0-0` (zeros, as some writers use) become SAN's `O-O` / `O-O-O`.
fn castling_with_letters(text: &str) -> String {
    if text.starts_with("0-0") {
        text.replace('0', "O")
    } else {
        text.to_string()
    }
}

/// A move in both notations, as shown to the solver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MoveText {
    pub uci: String,
    pub san: String,
}

impl MoveText {
    /// `m` must be legal in `position` (the position before the move).
    pub fn of(position: &Chess, m: Move) -> MoveText {
        MoveText {
            uci: UciMove::from_standard(m).to_string(),
            san: SanPlus::from_move(position.clone(), m).to_string(),
        }
    }
}

impl std::fmt::Display for MoveText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.uci, self.san)
    }
}

pub(crate) fn color_name(color: Color) -> &'static str {
    match color {
        Color::White => "white",
        Color::Black => "black",
    }
}

/// The board as text: ranks 8 to 1 top-down, white pieces upper case, `.` for an empty square,
/// file letters underneath.
pub(crate) fn ascii_board(position: &Chess) -> String {
    let board = position.board();
    let mut text = String::new();
    for rank in Rank::ALL.into_iter().rev() {
        text.push(rank.char());
        for file in File::ALL {
            text.push(' ');
            let square = Square::from_coords(file, rank);
            text.push(board.piece_at(square).map_or('.', |piece| piece.char()));
        }
        text.push('\n');
    }
    text.push_str("  a b c d e f g h");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use shakmaty::fen::Fen;
    use shakmaty::CastlingMode;

    fn position(fen: &str) -> Chess {
        let parsed: Fen = fen.parse().expect("test FEN parses");
        parsed.into_position(CastlingMode::Standard).expect("test FEN is legal")
    }

    fn uci_of(position: &Chess, text: &str) -> Result<String, MoveRejection> {
        parse_move(position, text).map(|m| UciMove::from_standard(m).to_string())
    }

    #[test]
    fn uci_and_san_name_the_same_moves() {
        let start = Chess::default();
        assert_eq!(uci_of(&start, "e2e4"), Ok("e2e4".into()));
        assert_eq!(uci_of(&start, "e4"), Ok("e2e4".into()));
        assert_eq!(uci_of(&start, "Nf3"), Ok("g1f3".into()));
        assert_eq!(uci_of(&start, " g1f3 "), Ok("g1f3".into()));
        assert_eq!(uci_of(&start, "Nf3!?"), Ok("g1f3".into()));
    }

    #[test]
    fn castling_in_every_spelling() {
        let castle_ready = position("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1");
        for text in ["e1g1", "O-O", "0-0", "e1h1"] {
            assert_eq!(uci_of(&castle_ready, text), Ok("e1g1".into()), "{text}");
        }
        for text in ["e1c1", "O-O-O", "0-0-0"] {
            assert_eq!(uci_of(&castle_ready, text), Ok("e1c1".into()), "{text}");
        }
    }

    #[test]
    fn promotion_and_check_suffixes() {
        let promoting = position("8/4P3/8/8/8/8/k7/4K3 w - - 0 1");
        assert_eq!(uci_of(&promoting, "e8=Q"), Ok("e7e8q".into()));
        assert_eq!(uci_of(&promoting, "e8=Q+"), Ok("e7e8q".into()));
        assert_eq!(uci_of(&promoting, "e7e8n"), Ok("e7e8n".into()));
        let mating = position("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1");
        assert_eq!(uci_of(&mating, "Ra8#"), Ok("a1a8".into()));
        assert_eq!(uci_of(&mating, "Ra8"), Ok("a1a8".into()));
    }

    #[test]
    fn malformed_and_illegal_are_told_apart() {
        let start = Chess::default();
        assert_eq!(uci_of(&start, "hello"), Err(MoveRejection::Malformed));
        assert_eq!(uci_of(&start, ""), Err(MoveRejection::Malformed));
        assert_eq!(uci_of(&start, "e2e5"), Err(MoveRejection::Illegal));
        assert_eq!(uci_of(&start, "Nf6"), Err(MoveRejection::Illegal));
        assert_eq!(uci_of(&start, "O-O"), Err(MoveRejection::Illegal));
    }

    #[test]
    fn move_text_gives_both_notations() {
        let start = Chess::default();
        let m = parse_move(&start, "g1f3").expect("legal");
        assert_eq!(MoveText::of(&start, m).to_string(), "g1f3 (Nf3)");
    }

    #[test]
    fn board_is_drawn_from_rank_8_down() {
        let text = ascii_board(&Chess::default());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 9);
        assert_eq!(lines[0], "8 r n b q k b n r");
        assert_eq!(lines[6], "2 P P P P P P P P");
        assert_eq!(lines[8], "  a b c d e f g h");
    }
}
