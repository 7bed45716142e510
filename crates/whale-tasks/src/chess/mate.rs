//! Exhaustive search for short forced mates, the proof behind every generated puzzle.
//!
//! Moves are tried in UCI order so that every choice (which mate to store, which defence to
//! play) is deterministic.

use shakmaty::uci::UciMove;
use shakmaty::{Chess, Move, Position};

/// Legal moves in UCI order.
pub(crate) fn sorted_moves(position: &Chess) -> Vec<Move> {
    let mut moves: Vec<Move> = position.legal_moves().into_iter().collect();
    moves.sort_by_cached_key(|&m| UciMove::from_standard(m).to_string());
    moves
}

pub(crate) fn after(position: &Chess, m: Move) -> Chess {
    let mut next = position.clone();
    next.play_unchecked(m);
    next
}

fn is_mate_after(position: &Chess, m: Move) -> bool {
    after(position, m).is_checkmate()
}

/// Every move that checkmates at once, in UCI order.
pub(crate) fn mating_moves(position: &Chess) -> Vec<Move> {
    sorted_moves(position).into_iter().filter(|&m| is_mate_after(position, m)).collect()
}

fn has_mate_in_one(position: &Chess) -> bool {
    position.legal_moves().into_iter().any(|m| is_mate_after(position, m))
}

/// A forced mate in two: `first`, the defence `reply`, then `mate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MateInTwo {
    pub first: Move,
    pub reply: Move,
    pub mate: Move,
}

/// Whether every defence to `first` leaves a mate in one (and some defence exists: a stalemating
/// or mating `first` is not a mate in two).
fn forces_mate_in_two(position: &Chess, first: Move) -> bool {
    let defended = after(position, first);
    let replies = defended.legal_moves();
    !replies.is_empty() && replies.into_iter().all(|reply| has_mate_in_one(&after(&defended, reply)))
}

/// The mate in two of a position that has no mate in one and exactly one first move that forces
/// mate, so that the stored solution is the only one. The stored defence is the one that leaves
/// the fewest mating answers (ties: first in UCI order); the stored mate is the first in UCI order.
pub(crate) fn unique_mate_in_two(position: &Chess) -> Option<MateInTwo> {
    if has_mate_in_one(position) {
        return None;
    }
    let mut forcing = sorted_moves(position).into_iter().filter(|&m| forces_mate_in_two(position, m));
    let first = forcing.next()?;
    if forcing.next().is_some() {
        return None;
    }
    let defended = after(position, first);
    let (reply, mates) = sorted_moves(&defended)
        .into_iter()
        .map(|reply| (reply, mating_moves(&after(&defended, reply))))
        .min_by_key(|(_, mates)| mates.len())?;
    Some(MateInTwo { first, reply, mate: *mates.first()? })
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

    fn uci(moves: &[Move]) -> Vec<String> {
        moves.iter().map(|&m| UciMove::from_standard(m).to_string()).collect()
    }

    #[test]
    fn finds_every_back_rank_mate() {
        // Either rook mates on the eighth rank.
        let two_rooks = position("6k1/5ppp/8/8/8/8/8/R3R1K1 w - - 0 1");
        assert_eq!(uci(&mating_moves(&two_rooks)), ["a1a8", "e1e8"]);
        assert!(mating_moves(&Chess::default()).is_empty());
    }

    #[test]
    fn two_forcing_first_moves_make_no_puzzle() {
        // Black Ka8 against Kc6 and Rh1: both 1. Kb6 (Kb8 2. Rh8#) and 1. Kc7 (Ka7 2. Ra1#) force mate.
        let position = position("k7/8/2K5/8/8/8/8/7R w - - 0 1");
        let forcing: Vec<Move> =
            sorted_moves(&position).into_iter().filter(|&m| forces_mate_in_two(&position, m)).collect();
        assert_eq!(uci(&forcing), ["c6b6", "c6c7"]);
        assert_eq!(unique_mate_in_two(&position), None);
    }

    #[test]
    fn finds_a_unique_mate_in_two() {
        // 1... Ba2+ 2. Ka1 (the rook on h2 guards a2 and b2, the bishop on e3 c1) Bd4#.
        let position = position("3k4/8/p1n1b3/P1p5/6pp/4b1N1/7r/1K6 b - - 8 40");
        let found = unique_mate_in_two(&position).expect("a mate in two");
        assert_eq!(uci(&[found.first, found.reply, found.mate]), ["e6a2", "b1a1", "e3d4"]);
    }

    #[test]
    fn a_mate_in_one_is_not_a_mate_in_two() {
        assert_eq!(unique_mate_in_two(&position("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1")), None);
    }
}
