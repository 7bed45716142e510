//! The experimental conditions: WHALE and the baselines it is compared with. A condition
//! decides which phases run and in what order ([`Plan`]); everything else (tasks, model,
//! budget, seeds) is shared, so conditions differ only in how they spend the same budget.

use crate::config::ScheduleConfig;
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
    /// Fixed alternation where each weight-step task is rolled out with a harness sampled
    /// from a population of the best harnesses found so far.
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

    /// The phase plan of this condition under `schedule`, for search iterations of about
    /// `search_iteration_cost` rollouts and weight steps of `weight_step_cost`.
    pub fn plan(self, schedule: &ScheduleConfig, weight_step_cost: u64, search_iteration_cost: u64) -> Plan {
        match self {
            Condition::Whale | Condition::FastSlow => {
                Plan::Fixed { weight_steps: schedule.weight_steps, search_iterations: schedule.search_iterations }
            }
            Condition::WhaleAdaptive => Plan::Adaptive,
            Condition::WeightOnly => Plan::WeightsOnly,
            Condition::HarnessOnly => Plan::SearchOnly,
            Condition::Sequential => {
                let share = schedule.sequential_weight_share.unwrap_or_else(|| {
                    let weights = schedule.weight_steps * weight_step_cost;
                    let search = schedule.search_iterations * search_iteration_cost;
                    weights as f64 / (weights + search).max(1) as f64
                });
                Plan::Sequential { weight_rollouts: (share * schedule.budget as f64).round() as u64 }
            }
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

/// The order of phases a condition follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plan {
    /// `weight_steps` weight steps, then `search_iterations` search iterations, repeated.
    Fixed {
        weight_steps: u64,
        search_iterations: u64,
    },
    /// Phases switched by the adaptive rules.
    Adaptive,
    WeightsOnly,
    SearchOnly,
    /// Weight steps until `weight_rollouts` are spent on them, then search.
    Sequential {
        weight_rollouts: u64,
    },
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

    #[test]
    fn sequential_spends_the_fixed_schedules_weight_share_on_weights_first() {
        let schedule = ScheduleConfig { budget: 1000, weight_steps: 4, search_iterations: 2, ..Default::default() };
        // 4 steps x 50 = 200 rollouts on weights, 2 x 100 = 200 on search: half the budget.
        assert_eq!(Condition::Sequential.plan(&schedule, 50, 100), Plan::Sequential { weight_rollouts: 500 });
        let fixed = ScheduleConfig { sequential_weight_share: Some(0.25), ..schedule.clone() };
        assert_eq!(Condition::Sequential.plan(&fixed, 50, 100), Plan::Sequential { weight_rollouts: 250 });
        assert_eq!(Condition::FastSlow.plan(&schedule, 50, 100), Plan::Fixed { weight_steps: 4, search_iterations: 2 });
    }
}
