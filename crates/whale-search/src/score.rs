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
