//! When to switch between the weight phase and the harness phase, and when to stop.
//!
//! The decision is a pure function of the plan, the budget and the outcomes of the units done
//! so far, so a resumed run takes exactly the decisions the uninterrupted one would have taken
//! and the switching rules can be tested on scripted sequences. The adaptive rules follow the
//! paper: a harness phase runs at least `search_min` iterations, stops after `search_patience`
//! iterations in a row without a new best, and runs at most `search_max`; a weight phase runs at
//! least `weight_min` steps and stops when the sliding mean of its training reward (window
//! `weight_window`) has not improved for `weight_patience` steps, or after `weight_max` steps.

use crate::condition::Condition;
use crate::config::{AdaptiveConfig, ScheduleConfig};
use serde::{Deserialize, Serialize};

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

impl Plan {
    /// The phase plan of `condition` under `schedule`, for search iterations of about
    /// `search_iteration_cost` rollouts and weight steps of `weight_step_cost`.
    pub fn of(
        condition: Condition,
        schedule: &ScheduleConfig,
        weight_step_cost: u64,
        search_iteration_cost: u64,
    ) -> Plan {
        match condition {
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
}

/// The two halves of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Weights,
    Search,
}

/// What a finished unit of work tells the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Outcome {
    /// A weight step and the mean reward of its rollouts.
    Weights { reward: f64 },
    /// A search iteration (the incumbent's re-scoring at a phase start included), whether it
    /// found a new best harness, and the rollouts it cost (0 when every candidate it proposed
    /// had been scored under these weights already).
    Search {
        new_best: bool,
        #[serde(default)]
        rollouts: u64,
    },
}

impl Outcome {
    pub fn phase(&self) -> Phase {
        match self {
            Outcome::Weights { .. } => Phase::Weights,
            Outcome::Search { .. } => Phase::Search,
        }
    }
}

/// The rollouts spent so far, as the scheduler counts them against the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spent {
    /// Weight phase plus search.
    pub training: u64,
    pub weights: u64,
}

/// Decides the next unit of work.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduler {
    pub plan: Plan,
    pub budget: u64,
    pub adaptive: AdaptiveConfig,
    /// A search that cannot hand over to weights (harness-only, the end of sequential) stops
    /// after this many iterations in a row that cost nothing: its proposer only re-proposes
    /// harnesses already scored, so the budget would never be spent.
    pub search_stale_limit: u64,
}

impl Scheduler {
    /// The phase of the next unit, or `None` when the run is over.
    pub fn next(&self, history: &[Outcome], spent: Spent) -> Option<Phase> {
        if spent.training >= self.budget {
            return None;
        }
        let current = history.last().map(Outcome::phase);
        let run = current_phase_run(history);
        let search_to_the_end = match self.plan {
            Plan::SearchOnly => true,
            Plan::Sequential { weight_rollouts } => current == Some(Phase::Search) || spent.weights >= weight_rollouts,
            _ => false,
        };
        if search_to_the_end && stale_iterations(history) >= self.search_stale_limit {
            return None;
        }
        Some(match self.plan {
            Plan::WeightsOnly => Phase::Weights,
            Plan::SearchOnly => Phase::Search,
            Plan::Sequential { .. } => {
                if search_to_the_end {
                    Phase::Search
                } else {
                    Phase::Weights
                }
            }
            Plan::Fixed { weight_steps, search_iterations } => match current {
                None => Phase::Weights,
                Some(Phase::Weights) if (run.len() as u64) < weight_steps => Phase::Weights,
                Some(Phase::Weights) => Phase::Search,
                Some(Phase::Search) if (run.len() as u64) < search_iterations => Phase::Search,
                Some(Phase::Search) => Phase::Weights,
            },
            Plan::Adaptive => match current {
                None => Phase::Weights,
                Some(Phase::Weights) if weight_phase_done(&self.adaptive, &rewards(run)) => Phase::Search,
                Some(Phase::Weights) => Phase::Weights,
                Some(Phase::Search) if search_phase_done(&self.adaptive, &new_bests(run)) => Phase::Weights,
                Some(Phase::Search) => Phase::Search,
            },
        })
    }
}

/// The trailing units that share the last unit's phase.
fn current_phase_run(history: &[Outcome]) -> &[Outcome] {
    let Some(last) = history.last() else { return history };
    let start = history.iter().rposition(|o| o.phase() != last.phase()).map_or(0, |i| i + 1);
    &history[start..]
}

/// Search iterations at the end of `history` in a row that cost no rollout.
fn stale_iterations(history: &[Outcome]) -> u64 {
    history.iter().rev().take_while(|o| matches!(o, Outcome::Search { rollouts: 0, .. })).count() as u64
}

fn rewards(run: &[Outcome]) -> Vec<f64> {
    run.iter().filter_map(|o| if let Outcome::Weights { reward } = o { Some(*reward) } else { None }).collect()
}

fn new_bests(run: &[Outcome]) -> Vec<bool> {
    run.iter().filter_map(|o| if let Outcome::Search { new_best, .. } = o { Some(*new_best) } else { None }).collect()
}

/// Whether a weight phase with these step rewards (oldest first) should end.
pub fn weight_phase_done(rules: &AdaptiveConfig, rewards: &[f64]) -> bool {
    let steps = rewards.len() as u64;
    if steps >= rules.weight_max {
        return true;
    }
    steps >= rules.weight_min
        && steps_since_window_improved(rewards, rules.weight_window as usize) >= rules.weight_patience
}

/// Steps since the sliding mean (over the last `window` rewards, fewer at the start) last
/// rose above every earlier value of it; the first step counts as an improvement.
pub fn steps_since_window_improved(rewards: &[f64], window: usize) -> u64 {
    let window = window.max(1);
    let mut best = f64::NEG_INFINITY;
    let mut last_improvement = 0;
    for end in 1..=rewards.len() {
        let slice = &rewards[end.saturating_sub(window)..end];
        let mean = slice.iter().sum::<f64>() / slice.len() as f64;
        if mean > best {
            best = mean;
            last_improvement = end;
        }
    }
    (rewards.len() - last_improvement) as u64
}

/// Whether a harness phase whose iterations found (or not) a new best should end.
pub fn search_phase_done(rules: &AdaptiveConfig, new_bests: &[bool]) -> bool {
    let iterations = new_bests.len() as u64;
    if iterations >= rules.search_max {
        return true;
    }
    let without = new_bests.iter().rev().take_while(|&&new| !new).count() as u64;
    iterations >= rules.search_min && without >= rules.search_patience
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> AdaptiveConfig {
        AdaptiveConfig {
            search_min: 5,
            search_patience: 2,
            search_max: 15,
            weight_min: 3,
            weight_window: 2,
            weight_patience: 3,
            weight_max: 40,
        }
    }

    /// Feeds scripted outcomes one unit at a time and returns the index of the first unit
    /// after which the scheduler switches away from `phase`.
    fn switch_point(scheduler: &Scheduler, phase: Phase, script: &[Outcome]) -> Option<usize> {
        let mut history = Vec::new();
        for (index, outcome) in script.iter().enumerate() {
            history.push(*outcome);
            if scheduler.next(&history, Spent::default()) != Some(phase) {
                return Some(index + 1);
            }
        }
        None
    }

    fn adaptive() -> Scheduler {
        Scheduler { plan: Plan::Adaptive, budget: u64::MAX, adaptive: rules(), search_stale_limit: 3 }
    }

    fn weights(rewards: &[f64]) -> Vec<Outcome> {
        rewards.iter().map(|&reward| Outcome::Weights { reward }).collect()
    }

    #[test]
    fn the_weight_phase_ends_exactly_when_its_patience_runs_out() {
        // Window-2 means: .1 .15 .25 .35 .35 .3 .3 ... the last rise is at step 4.
        let script = weights(&[0.1, 0.2, 0.3, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3]);
        assert_eq!(steps_since_window_improved(&[0.1, 0.2, 0.3, 0.4, 0.3, 0.3], 2), 2);
        assert_eq!(switch_point(&adaptive(), Phase::Weights, &script), Some(7));
        // Still rising: no switch until weight_max.
        let rising: Vec<f64> = (0..40).map(|i| i as f64 / 40.0).collect();
        assert_eq!(switch_point(&adaptive(), Phase::Weights, &weights(&rising)), Some(40));
    }

    #[test]
    fn the_weight_phase_runs_its_minimum_even_without_improvement() {
        let flat = weights(&[0.5; 10]);
        // Patience 3 runs out after step 4 (improvement at step 1), minimum 3 is met by then.
        assert_eq!(switch_point(&adaptive(), Phase::Weights, &flat), Some(4));
        let strict = Scheduler { adaptive: AdaptiveConfig { weight_min: 6, ..rules() }, ..adaptive() };
        assert_eq!(switch_point(&strict, Phase::Weights, &flat), Some(6));
    }

    #[test]
    fn the_search_phase_needs_its_minimum_then_stops_after_two_without_a_new_best() {
        let scheduler = adaptive();
        let mut history = weights(&[0.5; 4]);
        assert_eq!(scheduler.next(&history, Spent::default()), Some(Phase::Search));
        let script: Vec<Outcome> = [false, true, false, true, true, false, false, true]
            .iter()
            .map(|&new_best| Outcome::Search { new_best, rollouts: 10 })
            .collect();
        history.push(script[0]);
        let mut switched = None;
        for (index, outcome) in script.iter().enumerate().skip(1) {
            history.push(*outcome);
            if scheduler.next(&history, Spent::default()) == Some(Phase::Weights) {
                switched = Some(index + 1);
                break;
            }
        }
        // Iterations 6 and 7 are the first two in a row without a new best after the minimum.
        assert_eq!(switched, Some(7));
        let never: Vec<Outcome> = (0..20).map(|_| Outcome::Search { new_best: true, rollouts: 10 }).collect();
        assert_eq!(switch_point(&Scheduler { plan: Plan::Adaptive, ..scheduler }, Phase::Search, &never), Some(15));
    }

    #[test]
    fn fixed_alternation_and_the_budget() {
        let fixed = Scheduler {
            plan: Plan::Fixed { weight_steps: 2, search_iterations: 3 },
            budget: 100,
            adaptive: rules(),
            search_stale_limit: 3,
        };
        let mut history = Vec::new();
        let mut phases = Vec::new();
        for _ in 0..10 {
            let phase = fixed.next(&history, Spent::default()).expect("within budget");
            phases.push(phase);
            history.push(match phase {
                Phase::Weights => Outcome::Weights { reward: 0.0 },
                Phase::Search => Outcome::Search { new_best: false, rollouts: 10 },
            });
        }
        use Phase::{Search as S, Weights as W};
        assert_eq!(phases, [W, W, S, S, S, W, W, S, S, S]);
        assert_eq!(fixed.next(&history, Spent { training: 99, weights: 0 }), Some(W));
        assert_eq!(fixed.next(&history, Spent { training: 100, weights: 0 }), None);
    }

    #[test]
    fn sequential_switches_once_its_weight_share_is_spent_and_never_goes_back() {
        let sequential = Scheduler {
            plan: Plan::Sequential { weight_rollouts: 300 },
            budget: 1000,
            adaptive: rules(),
            search_stale_limit: 3,
        };
        let mut history = weights(&[0.1; 3]);
        assert_eq!(sequential.next(&history, Spent { training: 299, weights: 299 }), Some(Phase::Weights));
        assert_eq!(sequential.next(&history, Spent { training: 300, weights: 300 }), Some(Phase::Search));
        history.push(Outcome::Search { new_best: false, rollouts: 10 });
        assert_eq!(sequential.next(&history, Spent { training: 400, weights: 200 }), Some(Phase::Search));
        let only = Scheduler { plan: Plan::WeightsOnly, ..sequential.clone() };
        assert_eq!(only.next(&history, Spent { training: 999, weights: 0 }), Some(Phase::Weights));
    }

    #[test]
    fn a_search_to_the_end_stops_once_its_proposer_only_repeats_itself() {
        let only = Scheduler { plan: Plan::SearchOnly, budget: 1000, adaptive: rules(), search_stale_limit: 3 };
        let free = Outcome::Search { new_best: false, rollouts: 0 };
        let paid = Outcome::Search { new_best: false, rollouts: 33 };
        let spent = Spent { training: 200, weights: 0 };
        assert_eq!(only.next(&[paid, free, free], spent), Some(Phase::Search));
        assert_eq!(only.next(&[paid, free, free, free], spent), None);
        assert_eq!(only.next(&[free, free, free, paid], spent), Some(Phase::Search));
        let fixed = Scheduler { plan: Plan::Fixed { weight_steps: 1, search_iterations: 4 }, ..only.clone() };
        assert_eq!(fixed.next(&[paid, free, free, free], spent), Some(Phase::Weights), "a fixed phase just ends");
        let sequential = Scheduler { plan: Plan::Sequential { weight_rollouts: 100 }, ..only };
        let step = Outcome::Weights { reward: 0.1 };
        assert_eq!(sequential.next(&[step, free, free, free], Spent { training: 150, weights: 100 }), None);
    }

    #[test]
    fn sequential_spends_the_fixed_schedules_weight_share_on_weights_first() {
        let schedule = ScheduleConfig { budget: 1000, weight_steps: 4, search_iterations: 2, ..Default::default() };
        // 4 steps x 50 = 200 rollouts on weights, 2 x 100 = 200 on search: half the budget.
        assert_eq!(Plan::of(Condition::Sequential, &schedule, 50, 100), Plan::Sequential { weight_rollouts: 500 });
        let fixed = ScheduleConfig { sequential_weight_share: Some(0.25), ..schedule.clone() };
        assert_eq!(Plan::of(Condition::Sequential, &fixed, 50, 100), Plan::Sequential { weight_rollouts: 250 });
        assert_eq!(
            Plan::of(Condition::FastSlow, &schedule, 50, 100),
            Plan::Fixed { weight_steps: 4, search_iterations: 2 }
        );
    }
}
