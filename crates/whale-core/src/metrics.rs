//! Scores over repeated rollouts: mean@k, pass@k and maj@k, each with a bootstrap interval.
//!
//! The paper reports mean@8 (per task the mean of 8 binary rewards, averaged over tasks);
//! pass@k and maj@k sit beside it. Intervals come from a percentile bootstrap over tasks with a
//! fixed seed, so the same inputs always print the same interval.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The k samples of one task: each sample's reward and its (normalised) answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSamples {
    pub rewards: Vec<f64>,
    /// Answers as comparable keys (`None` where there was no answer).
    pub answers: Vec<Option<String>>,
}

/// A point estimate with a 95% bootstrap confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} [{:.3}, {:.3}]", self.value, self.lo, self.hi)
    }
}

/// mean@k, pass@k and maj@k over a set of tasks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub tasks: usize,
    pub k: usize,
    pub mean: Estimate,
    pub pass: Estimate,
    pub maj: Estimate,
}

/// Mean reward of one task's samples.
pub fn task_mean(s: &TaskSamples) -> f64 {
    if s.rewards.is_empty() {
        0.0
    } else {
        s.rewards.iter().sum::<f64>() / s.rewards.len() as f64
    }
}

/// Unbiased pass@k estimate for one task from n samples with c successes (Chen et al., 2021):
/// 1 - C(n-c, k) / C(n, k). With k = n it is 1 when any sample succeeded.
pub fn task_pass_at(s: &TaskSamples, k: usize) -> f64 {
    let n = s.rewards.len();
    let c = s.rewards.iter().filter(|&&r| r > 0.5).count();
    if n == 0 || k == 0 {
        return 0.0;
    }
    let k = k.min(n);
    if n - c < k {
        return 1.0;
    }
    let fail: f64 = ((n - c - k + 1)..=(n - c)).zip((n - k + 1)..=n).map(|(a, b)| a as f64 / b as f64).product();
    1.0 - fail
}

/// maj@k for one task: the reward of the most common answer (ties broken by the first to
/// reach the top count, so the result is deterministic). Samples without an answer do not vote.
pub fn task_majority(s: &TaskSamples) -> f64 {
    let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, a) in s.answers.iter().enumerate() {
        if let Some(a) = a {
            let e = counts.entry(a.as_str()).or_insert((0, i));
            e.0 += 1;
        }
    }
    let best = counts.values().max_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1))).map(|&(_, first)| first);
    best.map_or(0.0, |i| s.rewards.get(i).copied().unwrap_or(0.0))
}

/// Percentile bootstrap (95%) of the mean of `values`, resampling tasks.
pub fn bootstrap_mean(values: &[f64], resamples: usize, seed: u64) -> Estimate {
    let n = values.len();
    if n == 0 {
        return Estimate { value: 0.0, lo: 0.0, hi: 0.0 };
    }
    let value = values.iter().sum::<f64>() / n as f64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> =
        (0..resamples.max(1)).map(|_| (0..n).map(|_| values[rng.gen_range(0..n)]).sum::<f64>() / n as f64).collect();
    means.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| means[((q * (means.len() - 1) as f64).round() as usize).min(means.len() - 1)];
    Estimate { value, lo: at(0.025), hi: at(0.975) }
}

/// Percentile bootstrap (95%) of a mean over seeds of per-seed means over tasks, with seeds
/// as a level: each resample draws the seeds with replacement, then within each drawn seed
/// its tasks with replacement. `per_seed[s]` holds seed s's values (paired differences, one
/// per test task); a seed without values is left out.
pub fn bootstrap_nested_mean(per_seed: &[Vec<f64>], resamples: usize, seed: u64) -> Estimate {
    let seeds: Vec<&Vec<f64>> = per_seed.iter().filter(|values| !values.is_empty()).collect();
    if seeds.is_empty() {
        return Estimate { value: 0.0, lo: 0.0, hi: 0.0 };
    }
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len() as f64;
    let value = seeds.iter().map(|values| mean(values)).sum::<f64>() / seeds.len() as f64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let total: f64 = (0..seeds.len())
                .map(|_| {
                    let values = seeds[rng.gen_range(0..seeds.len())];
                    (0..values.len()).map(|_| values[rng.gen_range(0..values.len())]).sum::<f64>() / values.len() as f64
                })
                .sum();
            total / seeds.len() as f64
        })
        .collect();
    means.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| means[((q * (means.len() - 1) as f64).round() as usize).min(means.len() - 1)];
    Estimate { value, lo: at(0.025), hi: at(0.975) }
}

/// All three scores with 1000-resample bootstrap intervals.
pub fn score(tasks: &[TaskSamples], k: usize) -> Scores {
    let per = |f: &dyn Fn(&TaskSamples) -> f64| tasks.iter().map(f).collect::<Vec<_>>();
    Scores {
        tasks: tasks.len(),
        k,
        mean: bootstrap_mean(&per(&task_mean), 1000, 17),
        pass: bootstrap_mean(&per(&|s| task_pass_at(s, k)), 1000, 17),
        maj: bootstrap_mean(&per(&task_majority), 1000, 17),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(rewards: &[f64], answers: &[&str]) -> TaskSamples {
        TaskSamples {
            rewards: rewards.to_vec(),
            answers: answers.iter().map(|a| (!a.is_empty()).then(|| a.to_string())).collect(),
        }
    }

    #[test]
    fn pass_at_k_matches_the_combinatorial_formula() {
        let s = samples(&[1.0, 0.0, 0.0, 0.0], &["a", "b", "c", "d"]);
        assert!((task_pass_at(&s, 1) - 0.25).abs() < 1e-12);
        // 1 - C(3,2)/C(4,2) = 1 - 3/6
        assert!((task_pass_at(&s, 2) - 0.5).abs() < 1e-12);
        assert_eq!(task_pass_at(&s, 4), 1.0);
        assert_eq!(task_pass_at(&samples(&[0.0, 0.0], &["", ""]), 2), 0.0);
    }

    #[test]
    fn majority_takes_the_most_common_answer_and_ignores_missing_ones() {
        let s = samples(&[0.0, 1.0, 1.0, 0.0, 0.0], &["7", "8", "8", "", ""]);
        assert_eq!(task_majority(&s), 1.0);
        let wrong = samples(&[0.0, 0.0, 1.0], &["7", "7", "8"]);
        assert_eq!(task_majority(&wrong), 0.0);
        assert_eq!(task_majority(&samples(&[0.0], &[""])), 0.0);
    }

    #[test]
    fn bootstrap_interval_brackets_the_mean_and_shrinks_with_more_tasks() {
        let small: Vec<f64> = (0..20).map(|i| (i % 2) as f64).collect();
        let large: Vec<f64> = (0..2000).map(|i| (i % 2) as f64).collect();
        let a = bootstrap_mean(&small, 500, 1);
        let b = bootstrap_mean(&large, 500, 1);
        assert!((a.value - 0.5).abs() < 1e-12 && a.lo <= 0.5 && a.hi >= 0.5);
        assert!(b.hi - b.lo < a.hi - a.lo);
        assert_eq!(a, bootstrap_mean(&small, 500, 1));
    }

    #[test]
    fn scores_average_over_tasks() {
        let tasks = vec![samples(&[1.0, 1.0], &["1", "1"]), samples(&[0.0, 1.0], &["2", "3"])];
        let s = score(&tasks, 2);
        assert!((s.mean.value - 0.75).abs() < 1e-12);
        assert!((s.pass.value - 1.0).abs() < 1e-12);
        assert!((s.maj.value - 0.5).abs() < 1e-12);
    }

    #[test]
    fn the_nested_bootstrap_matches_its_exact_distribution_on_small_tables() {
        // One seed, two tasks: a resample's mean is d1 (p 1/4), the midpoint (1/2) or d2 (1/4),
        // so the 2.5% and 97.5% points are d1 and d2 exactly.
        let one = bootstrap_nested_mean(&[vec![-0.5, 0.25]], 2000, 3);
        assert_eq!((one.value, one.lo, one.hi), (-0.125, -0.5, 0.25));
        // Two seeds of one task each: the seeds are the level that varies.
        let two = bootstrap_nested_mean(&[vec![0.1], vec![0.3]], 2000, 3);
        assert!((two.value - 0.2).abs() < 1e-12);
        assert_eq!((two.lo, two.hi), (0.1, 0.3));
        // Identical differences everywhere: no spread at all.
        let flat = bootstrap_nested_mean(&[vec![0.0; 5], vec![0.0; 5]], 500, 3);
        assert_eq!((flat.value, flat.lo, flat.hi), (0.0, 0.0, 0.0));
        // A seed without values is left out, and nothing at all gives zero.
        assert_eq!(bootstrap_nested_mean(&[vec![], vec![0.4]], 100, 1).value, 0.4);
        assert_eq!(bootstrap_nested_mean(&[], 100, 1).value, 0.0);
    }
}
