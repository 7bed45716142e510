//! Synthetic mate puzzles at two difficulties, for models too weak for real Lichess puzzles.
//!
//! Seeded random games, biased toward captures and checks so that kings get exposed, are
//! searched after every move for a forced mate of the side to move; the move that led there is
//! the opponent's setup move, as in the Lichess format. Every puzzle is proved by [`super::mate`].

use super::mate::{after, mating_moves, unique_mate_in_two};
use super::puzzle::Puzzle;
use rand::distributions::{Distribution, WeightedIndex};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shakmaty::fen::Fen;
use shakmaty::{Chess, EnPassantMode, Move, Position};
use std::collections::HashSet;
use whale_core::Task;

/// The deepest mate the generator proves (difficulty 2 = mate in two).
pub(crate) const MAX_DIFFICULTY: u32 = 2;
/// Plies of random play before positions are searched, so that openings are left behind.
const FIRST_SEARCHED_PLY: usize = 12;
/// A game that has not produced a puzzle by then is abandoned.
const MAX_GAME_PLIES: usize = 160;
/// Extra weight of a capture and of a check in the random move choice.
const CAPTURE_WEIGHT: u32 = 4;
const CHECK_WEIGHT: u32 = 6;

/// `n` verified mate puzzles; `difficulty` 1 is mate in one, 2 mate in two (other values are
/// clamped into 1..=2). The same seed gives the same puzzles.
pub(crate) fn generate(n: usize, seed: u64, difficulty: u32) -> Vec<Task> {
    let depth = difficulty.clamp(1, MAX_DIFFICULTY);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seen = HashSet::new();
    let mut tasks = Vec::with_capacity(n);
    while tasks.len() < n {
        let Some(puzzle) = puzzle_from_random_game(&mut rng, depth, tasks.len(), seed) else {
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
