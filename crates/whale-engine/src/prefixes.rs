//! The caches of finished sequences, kept for later prompts that begin with their tokens.
//!
//! An agent's calls repeat themselves: a multi-turn rollout's next call is its last prompt and
//! reply plus a new turn, self-consistency asks the same prompt several times one after
//! another, and every prompt of a harness opens with the same instructions and examples. A
//! finished sequence's cache holds the keys and values of all those tokens, so the scheduler
//! keeps the most recent ones here, up to a budget of tokens, and a new prompt starts from a
//! copy of the longest prefix it shares with one of them instead of feeding it again.

use std::collections::VecDeque;

use whale_lm::decoder::DecoderCache;

/// A finished sequence's cache and the tokens it holds.
struct Entry {
    tokens: Vec<u32>,
    cache: DecoderCache,
}

/// Finished sequences' caches, most recently stored or used last, holding at most `budget`
/// tokens between them.
pub(crate) struct PrefixStore {
    entries: VecDeque<Entry>,
    tokens: usize,
    budget: usize,
}

impl PrefixStore {
    pub(crate) fn new(budget: usize) -> Self {
        Self { entries: VecDeque::new(), tokens: 0, budget }
    }

    /// Keeps `cache`, which holds `tokens`, dropping the least recently used entries beyond the
    /// budget. An entry whose tokens begin the new one's is dropped (the new one serves every
    /// prompt it served); a cache whose tokens begin a kept entry's is not kept.
    pub(crate) fn insert(&mut self, tokens: Vec<u32>, cache: DecoderCache) {
        if tokens.is_empty() || tokens.len() > self.budget {
            return;
        }
        if self.entries.iter().any(|entry| entry.tokens.starts_with(&tokens)) {
            return;
        }
        self.entries.retain(|entry| !tokens.starts_with(&entry.tokens));
        self.entries.push_back(Entry { tokens, cache });
        self.tokens = self.entries.iter().map(|entry| entry.tokens.len()).sum();
        while self.tokens > self.budget {
            let Some(oldest) = self.entries.pop_front() else { break };
            self.tokens -= oldest.tokens.len();
        }
    }

    /// The index of the entry sharing the longest prefix with `prompt`, and that prefix's
    /// length (the most recently used entry among equals).
    pub(crate) fn longest_prefix(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        (self.entries.iter().enumerate())
            .map(|(index, entry)| (shared_prefix(&entry.tokens, prompt), index))
            .filter(|&(shared, _)| shared > 0)
            .max()
            .map(|(shared, index)| (index, shared))
    }

    /// The cache of entry `index` (of [`Self::longest_prefix`]), which becomes the most recently
    /// used.
    pub(crate) fn use_entry(&mut self, index: usize) -> Option<&DecoderCache> {
        let entry = self.entries.remove(index)?;
        self.entries.push_back(entry);
        self.entries.back().map(|entry| &entry.cache)
    }

    /// Most tokens the entries may hold.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Drops every entry (the weights changed, so no cache is valid any more).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.tokens = 0;
    }

    /// Tokens held by the entries.
    #[cfg(test)]
    fn tokens(&self) -> usize {
        self.tokens
    }
}

/// How many tokens `a` and `b` share from the start.
pub(crate) fn shared_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_of(budget: usize, entries: &[&[u32]]) -> PrefixStore {
        let mut store = PrefixStore::new(budget);
        for tokens in entries {
            store.insert(tokens.to_vec(), DecoderCache::new(tokens.to_vec()));
        }
        store
    }

    /// The tokens of the entry sharing most with `prompt` (it becomes the most recently used),
    /// and how many it shares.
    fn best(store: &mut PrefixStore, prompt: &[u32]) -> Option<(Vec<u32>, usize)> {
        let (index, shared) = store.longest_prefix(prompt)?;
        let cache = store.use_entry(index).expect("the index just found");
        Some((cache.downcast_ref::<Vec<u32>>().expect("a test cache").clone(), shared))
    }

    #[test]
    fn the_longest_shared_prefix_wins_and_its_entry_is_used_last() {
        let mut store = store_of(100, &[&[1, 2, 3, 9], &[1, 2, 3, 4, 5], &[7, 8]]);
        assert_eq!(best(&mut store, &[1, 2, 3, 4, 6]), Some((vec![1, 2, 3, 4, 5], 4)));
        assert_eq!(best(&mut store, &[5, 5]), None, "nothing starts with 5");
        store.insert(vec![6; 94], DecoderCache::new(vec![6u32; 94]));
        assert_eq!(store.tokens(), 5 + 94, "the two least recently used went: {}", store.tokens());
        assert_eq!(best(&mut store, &[1, 2, 3, 9]), Some((vec![1, 2, 3, 4, 5], 3)), "[1, 2, 3, 9] itself went");
    }

    #[test]
    fn an_entry_a_later_one_extends_is_dropped_and_a_prefix_of_one_kept_is_not_stored() {
        let mut store = store_of(100, &[&[1, 2], &[1, 2, 3]]);
        assert_eq!(store.tokens(), 3, "[1, 2] is served by [1, 2, 3]");
        store.insert(vec![1], DecoderCache::new(vec![1u32]));
        assert_eq!(store.tokens(), 3);
        store.insert(vec![1; 101], DecoderCache::new(vec![1u32; 101]));
        assert_eq!(store.tokens(), 3, "a cache over the whole budget is not kept");
        store.clear();
        assert_eq!(best(&mut store, &[1, 2, 3]), None);
    }

    #[test]
    fn shared_prefix_counts_equal_leading_tokens() {
        assert_eq!(shared_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(shared_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(shared_prefix(&[], &[1]), 0);
    }
}
