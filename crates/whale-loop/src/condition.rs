//! The experimental conditions: WHALE and the baselines it is compared with. A condition
//! decides which phases run and in what order (its [`crate::schedule::Plan`]); everything else (tasks, model,
//! budget, seeds) is shared, so conditions differ only in how they spend the same budget.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One way of spending the training budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// Fixed alternation: E weight steps, then I search iterations, repeated.
    Whale,
    /// Alternation with adaptive switching on training signals.
    WhaleAdaptive,
    /// Online RFT alone, under the initial harness.
    WeightOnly,
    /// Meta-Harness alone, with the initial weights.
    HarnessOnly,
    /// All weight steps first, then all search.
    Sequential,
    /// Fast-Slow Training: fixed alternation where the slow weights learn by GRPO and each
    /// weight-step task is rolled out with a harness drawn from a pool (the per-instance Pareto
    /// frontier) of harnesses whose prompt text alone the search rewrites.
    FastSlow,
}

impl Condition {
    pub const ALL: [Condition; 6] = [
        Condition::Whale,
        Condition::WhaleAdaptive,
        Condition::WeightOnly,
        Condition::HarnessOnly,
        Condition::Sequential,
        Condition::FastSlow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Whale => "whale",
            Condition::WhaleAdaptive => "whale-adaptive",
            Condition::WeightOnly => "weight-only",
            Condition::HarnessOnly => "harness-only",
            Condition::Sequential => "sequential",
            Condition::FastSlow => "fast-slow",
        }
    }

    /// Whether weight steps sample their harness from a population.
    pub fn uses_population(self) -> bool {
        self == Condition::FastSlow
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Condition {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Condition::ALL.into_iter().find(|c| c.as_str() == text).ok_or_else(|| {
            let names: Vec<&str> = Condition::ALL.iter().map(|c| c.as_str()).collect();
            format!("unknown condition `{text}` (expected one of {})", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for condition in Condition::ALL {
            assert_eq!(condition.as_str().parse::<Condition>(), Ok(condition));
            let json = serde_json::to_string(&condition).expect("json");
            assert_eq!(json, format!("\"{condition}\""));
        }
        let error = "whales".parse::<Condition>().expect_err("unknown");
        assert!(error.contains("fast-slow"), "{error}");
    }
}
