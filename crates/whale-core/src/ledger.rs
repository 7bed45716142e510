//! The ledger: what a run has spent, split by purpose.
//!
//! WHALE is compared with its baselines at an equal rollout budget, so every rollout and
//! token is counted once, under the purpose it served; test-evaluation rollouts and
//! proposer tokens are kept apart from the training budget.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why rollouts or tokens were spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    WeightPhase,
    Search,
    TestEval,
    Proposer,
}

/// Rollouts, tokens and wall time spent for one purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spend {
    pub rollouts: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub wall_s: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    pub by_purpose: BTreeMap<Purpose, Spend>,
}

impl Ledger {
    pub fn record(&mut self, purpose: Purpose, spend: Spend) {
        let e = self.by_purpose.entry(purpose).or_default();
        e.rollouts += spend.rollouts;
        e.prompt_tokens += spend.prompt_tokens;
        e.completion_tokens += spend.completion_tokens;
        e.wall_s += spend.wall_s;
    }

    pub fn get(&self, purpose: Purpose) -> Spend {
        self.by_purpose.get(&purpose).copied().unwrap_or_default()
    }

    /// Rollouts that count against the training budget: weight phase plus search.
    pub fn training_rollouts(&self) -> u64 {
        self.get(Purpose::WeightPhase).rollouts + self.get(Purpose::Search).rollouts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spends_accumulate_per_purpose_and_test_eval_is_not_training() {
        let mut l = Ledger::default();
        let s = Spend { rollouts: 8, prompt_tokens: 100, completion_tokens: 50, wall_s: 1.5 };
        l.record(Purpose::WeightPhase, s);
        l.record(Purpose::WeightPhase, s);
        l.record(Purpose::Search, Spend { rollouts: 3, ..Spend::default() });
        l.record(Purpose::TestEval, Spend { rollouts: 64, ..Spend::default() });
        assert_eq!(l.get(Purpose::WeightPhase).rollouts, 16);
        assert_eq!(l.get(Purpose::WeightPhase).completion_tokens, 100);
        assert_eq!(l.training_rollouts(), 19);
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<Ledger>(&json).unwrap(), l);
    }
}
