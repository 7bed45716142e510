//! Pareto fronts over harness candidates: success first, then cost.
//!
//! A candidate is kept on the front unless another one is at least as good on every
//! objective and strictly better on one. Acceptance picks, among the front, the highest
//! success rate and breaks ties by the lower cost, so "no change" can win.

use serde::{Deserialize, Serialize};

/// The objectives of one candidate: success is maximised, the costs are minimised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Objectives {
    pub success: f64,
    pub mean_turns: f64,
    pub mean_tokens: f64,
}

impl Objectives {
    /// Whether `self` dominates `other`.
    pub fn dominates(&self, other: &Objectives) -> bool {
        let ge = self.success >= other.success
            && self.mean_turns <= other.mean_turns
            && self.mean_tokens <= other.mean_tokens;
        let gt =
            self.success > other.success || self.mean_turns < other.mean_turns || self.mean_tokens < other.mean_tokens;
        ge && gt
    }
}

/// Indices of the non-dominated items, in input order.
pub fn front(items: &[Objectives]) -> Vec<usize> {
    (0..items.len()).filter(|&i| !items.iter().any(|o| o.dominates(&items[i]))).collect()
}

/// The index of the best item: highest success, then fewest turns, then fewest tokens;
/// ties keep the earliest item (put the incumbent first to prefer "no change").
pub fn best(items: &[Objectives]) -> Option<usize> {
    (0..items.len()).reduce(|b, i| {
        let (x, y) = (&items[i], &items[b]);
        let better = x.success > y.success
            || (x.success == y.success && x.mean_turns < y.mean_turns)
            || (x.success == y.success && x.mean_turns == y.mean_turns && x.mean_tokens < y.mean_tokens);
        if better {
            i
        } else {
            b
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(success: f64, mean_turns: f64, mean_tokens: f64) -> Objectives {
        Objectives { success, mean_turns, mean_tokens }
    }

    #[test]
    fn front_drops_dominated_candidates_only() {
        let items = [o(0.5, 2.0, 100.0), o(0.6, 3.0, 200.0), o(0.5, 3.0, 150.0), o(0.4, 1.0, 50.0)];
        assert_eq!(front(&items), vec![0, 1, 3]);
    }

    #[test]
    fn best_prefers_success_then_cost_then_the_earliest() {
        assert_eq!(best(&[o(0.5, 2.0, 100.0), o(0.6, 3.0, 900.0)]), Some(1));
        assert_eq!(best(&[o(0.5, 2.0, 100.0), o(0.5, 2.0, 90.0)]), Some(1));
        assert_eq!(best(&[o(0.5, 2.0, 100.0), o(0.5, 2.0, 100.0)]), Some(0));
        assert_eq!(best(&[]), None);
    }
}
