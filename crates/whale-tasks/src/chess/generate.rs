//! Synthetic mate puzzles at four difficulties, for models too weak for real Lichess puzzles.
//!
//! Two sources, each at mate in one and mate in two:
//! - endgames (difficulties 1 and 2): a few pieces placed at random — the mating side's king
//!   with a queen or rooks and perhaps a minor piece, the defender's king with at most two pawns
//!   or a minor piece — so that the board is short to read and the mates follow a handful of
//!   patterns (the king on an edge, a heavy piece checking along it);
//! - random play (difficulties 3 and 4): seeded random games, biased toward captures and checks
//!   so that kings get exposed, searched after every move: middlegame positions full of pieces.
//!
//! In both, the defender's move that leads to the position is the setup move, as in the
//! Lichess format, and every puzzle is proved by [`super::mate`].

use super::mate::{after, mating_moves, unique_mate_in_two};
use super::puzzle::{parse_position, Puzzle};
use rand::distributions::{Distribution, WeightedIndex};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shakmaty::fen::Fen;
use shakmaty::{Chess, EnPassantMode, Move, Position};
use std::collections::HashSet;
use whale_core::Task;

/// The hardest difficulty: mate in two from random play.
pub(crate) const MAX_DIFFICULTY: u32 = 4;
/// Plies of random play before positions are searched, so that openings are left behind.
const FIRST_SEARCHED_PLY: usize = 12;
/// A game that has not produced a puzzle by then is abandoned.
const MAX_GAME_PLIES: usize = 160;
/// Extra weight of a capture and of a check in the random move choice.
const CAPTURE_WEIGHT: u32 = 4;
const CHECK_WEIGHT: u32 = 6;

/// `n` verified mate puzzles: difficulty 1 is an endgame mate in one, 2 an endgame mate in two,
/// 3 a mate in one from random play, 4 a mate in two from random play (other values are
/// clamped into 1..=4). The same seed gives the same puzzles.
pub(crate) fn generate(n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
    let difficulty = difficulty.clamp(1, MAX_DIFFICULTY);
    let depth = 2 - difficulty % 2;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seen = HashSet::new();
    let mut tasks = Vec::with_capacity(n);
    while tasks.len() < n {
        let found = if difficulty <= 2 {
            endgame_puzzle(&mut rng, depth, tasks.len(), seed)
        } else {
            puzzle_from_random_game(&mut rng, depth, tasks.len(), seed)
        };
        let Some(puzzle) = found else {
            continue;
        };
        if seen.insert(puzzle.fen.clone()) {
            tasks.push(puzzle.into_task());
        }
    }
    tasks
}

/// Plays one random game and returns the first puzzle of the wanted depth it reaches.
fn puzzle_from_random_game(rng: &mut ChaCha8Rng, depth: u32, index: usize, seed: u64) -> Option<Puzzle> {
    let mut position = Chess::default();
    for ply in 0..MAX_GAME_PLIES {
        let setup = random_move(&position, rng)?;
        let before = position.clone();
        position.play_unchecked(setup);
        if ply + 1 < FIRST_SEARCHED_PLY || position.is_game_over() {
            continue;
        }
        if let Some(solution) = solution(&position, depth) {
            let id = format!("gen-m{depth}-{seed}-{index}");
            return Some(puzzle(id, &before, setup, solution, depth));
        }
    }
    None
}

/// The mating side's pieces besides its king, one set drawn per endgame (upper case: the
/// mating side's colour is applied later).
const ATTACKERS: [&[char]; 8] =
    [&['Q'], &['R'], &['R', 'R'], &['Q', 'R'], &['R', 'B'], &['R', 'N'], &['Q', 'N'], &['Q', 'B']];
/// The defender's pieces besides its king.
const DEFENDERS: [&[char]; 5] = [&[], &['P'], &['P', 'P'], &['N'], &['B']];

/// One endgame drawn at random, with the defender to move; its setup move leads to the puzzle
/// when the position after it has a mate of exactly `depth` moves.
fn endgame_puzzle(rng: &mut ChaCha8Rng, depth: u32, index: usize, seed: u64) -> Option<Puzzle> {
    let before = random_endgame(rng)?;
    let setup = *before.legal_moves().choose(rng)?;
    let position = after(&before, setup);
    if position.is_game_over() {
        return None;
    }
    let line = solution(&position, depth)?;
    Some(puzzle(format!("gen-e{depth}-{seed}-{index}"), &before, setup, line, depth))
}

/// A legal position of two kings and a few pieces, the defender (the side to move) not yet mated.
fn random_endgame(rng: &mut ChaCha8Rng) -> Option<Chess> {
    let white_mates = rng.gen_bool(0.5);
    let case = |piece: char, mating: bool| if mating == white_mates { piece } else { piece.to_ascii_lowercase() };
    let mut pieces = vec![case('K', true), case('K', false)];
    pieces.extend(ATTACKERS.choose(rng)?.iter().map(|&p| case(p, true)));
    pieces.extend(DEFENDERS.choose(rng)?.iter().map(|&p| case(p, false)));
    let mut squares: Vec<usize> = (0..64).collect();
    squares.shuffle(rng);
    let mut board = ['.'; 64];
    for (piece, square) in pieces.into_iter().zip(squares) {
        let rank = square / 8;
        if piece.eq_ignore_ascii_case(&'P') && (rank == 0 || rank == 7) {
            return None;
        }
        board[square] = piece;
    }
    let defender = if white_mates { 'b' } else { 'w' };
    let position = parse_position(&format!("{} {defender} - - 0 40", board_fen(&board))).ok()?;
    (!position.is_game_over()).then_some(position)
}

/// The piece-placement field of a FEN for `board` (index 0 is a8, 63 is h1).
fn board_fen(board: &[char; 64]) -> String {
    let rank = |row: &[char]| {
        let mut text = String::new();
        let mut empty = 0;
        for &square in row {
            if square == '.' {
                empty += 1;
                continue;
            }
            if empty > 0 {
                text.push_str(&empty.to_string());
                empty = 0;
            }
            text.push(square);
        }
        if empty > 0 {
            text.push_str(&empty.to_string());
        }
        text
    };
    board.chunks(8).map(rank).collect::<Vec<_>>().join("/")
}

/// The solver's line (solver move, reply, ...) for a mate of exactly `depth` moves.
fn solution(position: &Chess, depth: u32) -> Option<Vec<Move>> {
    if depth == 1 {
        return mating_moves(position).first().map(|&m| vec![m]);
    }
    unique_mate_in_two(position).map(|mate| vec![mate.first, mate.reply, mate.mate])
}

/// A legal move, captures and checks weighted up; `None` when the game is over.
fn random_move(position: &Chess, rng: &mut ChaCha8Rng) -> Option<Move> {
    let moves = position.legal_moves();
    let weights = moves.iter().map(|&m| {
        let capture = if m.is_capture() { CAPTURE_WEIGHT } else { 0 };
        let check = if after(position, m).is_check() { CHECK_WEIGHT } else { 0 };
        1 + capture + check
    });
    let chooser = WeightedIndex::new(weights).ok()?;
    moves.get(chooser.sample(rng)).copied()
}

fn puzzle(id: String, before: &Chess, setup: Move, solution: Vec<Move>, depth: u32) -> Puzzle {
    let solver_position = after(before, setup);
    let choices = solver_position.legal_moves().len();
    let mut line = vec![setup];
    line.extend(solution);
    Puzzle {
        id,
        fen: Fen::from_position(before, EnPassantMode::Legal).to_string(),
        start: before.clone(),
        line,
        rating: Some(rating(depth, choices)),
        themes: themes(depth),
    }
}

/// Lichess-like ratings: about 700 for a mate in one and 1200 for a mate in two, more when the
/// solver has more moves to choose from.
fn rating(depth: u32, choices: usize) -> u32 {
    let choices = u32::try_from(choices).unwrap_or(u32::MAX).min(60);
    200 + 500 * depth + 8 * choices
}

fn themes(depth: u32) -> Vec<String> {
    let length = if depth == 1 { "oneMove" } else { "short" };
    ["mate", &format!("mateIn{depth}"), length].map(str::to_string).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endgames_have_few_pieces_and_the_defender_to_move() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let positions: Vec<Chess> = std::iter::repeat_with(|| random_endgame(&mut rng)).take(200).flatten().collect();
        assert!(positions.len() > 100, "most draws are legal: {}", positions.len());
        for position in &positions {
            let pieces = position.board().occupied().count();
            assert!((3..=6).contains(&pieces), "{pieces} pieces");
            assert!(!position.is_game_over());
        }
    }

    #[test]
    fn the_board_field_counts_empty_squares() {
        let mut board = ['.'; 64];
        board[4] = 'k';
        board[60] = 'K';
        board[63] = 'R';
        assert_eq!(board_fen(&board), "4k3/8/8/8/8/8/8/4K2R");
    }
}
