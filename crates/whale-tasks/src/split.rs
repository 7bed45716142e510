//! Train / search / test splits that are disjoint and stable across runs and machines.
//!
//! Tasks are ordered by a SHA-256 of (seed, task id) — not by a platform RNG or hash map
//! order — so the same file and seed give the same split everywhere, and adding tasks to
//! a file moves few existing tasks between subsets.

use sha2::{Digest, Sha256};
use whale_core::{Split, Task};

/// How many tasks each subset gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitSizes {
    pub train: usize,
    pub search: usize,
    pub test: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error("split asks for {asked} tasks (train {train} + search {search} + test {test}) but only {available} are available")]
    TooFew { asked: usize, available: usize, train: usize, search: usize, test: usize },
    #[error("task id `{0}` appears more than once; ids must be unique to split")]
    DuplicateId(String),
}

/// The three subsets, each task tagged with its split.
#[derive(Debug, Clone, Default)]
pub struct Splits {
    pub train: Vec<Task>,
    pub search: Vec<Task>,
    pub test: Vec<Task>,
}

fn rank(seed: u64, id: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(id.as_bytes());
    h.finalize().into()
}

/// Split `tasks` into disjoint subsets of the given sizes.
pub fn split(tasks: Vec<Task>, sizes: SplitSizes, seed: u64) -> Result<Splits, SplitError> {
    let asked = sizes.train + sizes.search + sizes.test;
    if asked > tasks.len() {
        return Err(SplitError::TooFew {
            asked,
            available: tasks.len(),
            train: sizes.train,
            search: sizes.search,
            test: sizes.test,
        });
    }
    let mut ranked: Vec<([u8; 32], Task)> = tasks.into_iter().map(|t| (rank(seed, &t.id), t)).collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
    if let Some(w) = ranked.windows(2).find(|w| w[0].1.id == w[1].1.id) {
        return Err(SplitError::DuplicateId(w[0].1.id.clone()));
    }
    let mut it = ranked.into_iter().map(|(_, t)| t);
    let mut take = |n: usize, s: Split| -> Vec<Task> {
        it.by_ref()
            .take(n)
            .map(|mut t| {
                t.split = Some(s);
                t
            })
            .collect()
    };
    Ok(Splits {
        train: take(sizes.train, Split::Train),
        search: take(sizes.search, Split::Search),
        test: take(sizes.test, Split::Test),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use whale_core::Domain;

    fn tasks(n: usize) -> Vec<Task> {
        (0..n)
            .map(|i| Task { id: format!("t{i}"), domain: Domain::Math, payload: serde_json::json!({}), split: None })
            .collect()
    }

    fn ids(v: &[Task]) -> Vec<String> {
        v.iter().map(|t| t.id.clone()).collect()
    }

    #[test]
    fn subsets_are_disjoint_sized_and_tagged() {
        let s = split(tasks(100), SplitSizes { train: 50, search: 20, test: 30 }, 3).unwrap();
        let all: HashSet<String> = ids(&s.train).into_iter().chain(ids(&s.search)).chain(ids(&s.test)).collect();
        assert_eq!(all.len(), 100);
        assert_eq!((s.train.len(), s.search.len(), s.test.len()), (50, 20, 30));
        assert!(s.test.iter().all(|t| t.split == Some(Split::Test)));
    }

    #[test]
    fn the_split_depends_on_seed_and_ids_not_on_input_order() {
        let sizes = SplitSizes { train: 10, search: 10, test: 10 };
        let a = split(tasks(40), sizes, 9).unwrap();
        let mut shuffled = tasks(40);
        shuffled.reverse();
        let b = split(shuffled, sizes, 9).unwrap();
        assert_eq!(ids(&a.test), ids(&b.test));
        let c = split(tasks(40), sizes, 10).unwrap();
        assert_ne!(ids(&a.test), ids(&c.test));
    }

    #[test]
    fn the_split_is_the_same_on_every_machine() {
        // SHA-256 of (seed as little-endian u64, id), computed independently with Python's hashlib.
        let s = split(tasks(10), SplitSizes { train: 0, search: 0, test: 3 }, 0).unwrap();
        assert_eq!(ids(&s.test), ["t0", "t3", "t6"]);
    }

    #[test]
    fn asking_too_much_or_duplicate_ids_is_an_error() {
        let sizes = SplitSizes { train: 5, search: 5, test: 5 };
        assert!(matches!(split(tasks(10), sizes, 0), Err(SplitError::TooFew { asked: 15, available: 10, .. })));
        let mut dup = tasks(20);
        dup[3].id = "t4".into();
        assert_eq!(split(dup, sizes, 0).unwrap_err(), SplitError::DuplicateId("t4".into()));
    }
}
