//! What one harness earned under one weights version on the search tasks: the Pareto
//! objectives plus the per-task outcomes that a paired test between two harnesses needs.

use serde::{Deserialize, Serialize};
use whale_core::{Objectives, Trajectory};

/// One search task's rollout, reduced to what acceptance compares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    pub task_id: String,
    pub reward: f64,
    pub success: bool,
    pub turns: usize,
    pub tokens: usize,
}

/// `scores.json` of one (content hash, weights version).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreCard {
    pub hash: String,
    pub weights_version: u64,
    /// Success rate, mean turns and mean tokens over the search tasks.
    pub objectives: Objectives,
    pub mean_reward: f64,
    /// Rollouts that ended with an error (a broken limit, an exception...).
    pub errors: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// In search-task order.
    pub tasks: Vec<TaskOutcome>,
}

impl ScoreCard {
    /// Scores `trajectories` (one per search task) of the harness with content hash `hash`.
    pub fn from_trajectories(hash: &str, weights_version: u64, trajectories: &[Trajectory]) -> Self {
        let tasks: Vec<TaskOutcome> = trajectories
            .iter()
            .map(|t| TaskOutcome {
                task_id: t.task_id.clone(),
                reward: t.reward,
                success: t.success,
                turns: t.turns,
                tokens: t.tokens(),
            })
            .collect();
        let mean = |f: &dyn Fn(&TaskOutcome) -> f64| {
            if tasks.is_empty() {
                0.0
            } else {
                tasks.iter().map(f).sum::<f64>() / tasks.len() as f64
            }
        };
        Self {
            hash: hash.to_string(),
            weights_version,
            objectives: Objectives {
                success: mean(&|t| f64::from(u8::from(t.success))),
                mean_turns: mean(&|t| t.turns as f64),
                mean_tokens: mean(&|t| t.tokens as f64),
            },
            mean_reward: mean(&|t| t.reward),
            errors: trajectories.iter().filter(|t| t.error.is_some()).count(),
            prompt_tokens: trajectories.iter().map(|t| t.prompt_tokens).sum(),
            completion_tokens: trajectories.iter().map(|t| t.completion_tokens).sum(),
            tasks,
        }
    }

    /// Rollouts behind this card.
    pub fn rollouts(&self) -> usize {
        self.tasks.len()
    }
}

/// GEPA's per-instance Pareto frontier of scored candidates, at most `cap` of them (indices
/// into `cards`). A candidate is on it when it earns the best reward on some task that any
/// candidate solves at all, unless another candidate is best on every task it is best on and
/// on more (or on the same ones, with a higher mean reward: one of equals stays). The members
/// best on the most tasks come first, then by mean reward. Empty when no card earns a reward.
///
/// A population drawn from it keeps a harness that is the only one to solve some task, which a
/// ranking by mean reward would drop.
pub fn instance_frontier(cards: &[ScoreCard], cap: usize) -> Vec<usize> {
    let mut best_on: Vec<Vec<&str>> = vec![Vec::new(); cards.len()];
    let tasks: Vec<&str> = cards.iter().flat_map(|c| c.tasks.iter().map(|t| t.task_id.as_str())).collect();
    let mut seen = std::collections::HashSet::new();
    for task in tasks.into_iter().filter(|task| seen.insert(*task)) {
        let reward = |card: &ScoreCard| card.tasks.iter().find(|t| t.task_id == task).map_or(0.0, |t| t.reward);
        let top = cards.iter().map(reward).fold(0.0, f64::max);
        if top <= 0.0 {
            continue;
        }
        for (index, card) in cards.iter().enumerate() {
            if reward(card) >= top {
                best_on[index].push(task);
            }
        }
    }
    let dominated = |a: usize, b: usize| {
        let covers = best_on[a].iter().all(|task| best_on[b].contains(task));
        let wider = best_on[b].len() > best_on[a].len();
        let better =
            cards[b].mean_reward > cards[a].mean_reward || (cards[b].mean_reward == cards[a].mean_reward && b < a);
        covers && (wider || better)
    };
    let mut members: Vec<usize> = (0..cards.len())
        .filter(|&a| !best_on[a].is_empty() && !(0..cards.len()).any(|b| b != a && dominated(a, b)))
        .collect();
    members.sort_by(|&a, &b| {
        best_on[b]
            .len()
            .cmp(&best_on[a].len())
            .then(cards[b].mean_reward.total_cmp(&cards[a].mean_reward))
            .then(a.cmp(&b))
    });
    members.truncate(cap);
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(hash: &str, rewards: &[f64]) -> ScoreCard {
        let tasks: Vec<TaskOutcome> = rewards
            .iter()
            .enumerate()
            .map(|(i, &reward)| TaskOutcome {
                task_id: format!("t{i}"),
                reward,
                success: reward >= 1.0,
                turns: 1,
                tokens: 10,
            })
            .collect();
        ScoreCard {
            hash: hash.to_string(),
            weights_version: 0,
            objectives: Objectives { success: 0.0, mean_turns: 1.0, mean_tokens: 10.0 },
            mean_reward: rewards.iter().sum::<f64>() / rewards.len() as f64,
            errors: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            tasks,
        }
    }

    #[test]
    fn the_frontier_keeps_a_candidate_that_is_best_on_any_one_task() {
        let cards = [
            card("strong", &[1.0, 1.0, 1.0, 0.0, 0.0]),
            card("also-strong", &[1.0, 1.0, 0.0, 1.0, 0.0]),
            card("niche", &[0.0, 0.0, 0.0, 0.0, 1.0]),
            card("covered", &[1.0, 0.0, 0.0, 0.0, 0.0]),
            card("nothing", &[0.0, 0.0, 0.0, 0.0, 0.0]),
        ];
        assert_eq!(instance_frontier(&cards, 5), [0, 1, 2], "niche is the only one to solve t4");
        assert_eq!(instance_frontier(&cards, 2), [0, 1], "the cap keeps those best on the most tasks");
        let twins = [card("a", &[1.0, 0.0]), card("b", &[1.0, 0.0]), card("c", &[0.0, 0.5])];
        assert_eq!(instance_frontier(&twins, 5), [0, 2], "one of equals stays");
        assert!(instance_frontier(&[card("z", &[0.0, 0.0])], 3).is_empty());
    }
}
