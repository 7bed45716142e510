//! Answer scoring as the QA literature does it, so that whale's numbers compare with papers:
//! SQuAD's answer normalization, exact match over all aliases, and token F1 with the
//! HotpotQA evaluator's yes/no/noanswer rule (a yes/no answer earns F1 only when equal).
//!
//! One deliberate deviation: an alias that normalizes to nothing (NQ-open holds `---`, `)`,
//! `*` and `A+`) would, under plain SQuAD rules, match every empty or article-only prediction.
//! Such an alias is compared on its trimmed, lowercased raw text instead.

use std::collections::HashMap;
use whale_core::Verdict;

/// The words the HotpotQA evaluator scores all-or-nothing in F1.
const ALL_OR_NOTHING_ANSWERS: [&str; 3] = ["yes", "no", "noanswer"];

/// Which number becomes the episode reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMetric {
    #[default]
    ExactMatch,
    F1,
}

/// Both metrics for one prediction, and the verdict under the chosen reward metric.
#[derive(Debug, Clone, PartialEq)]
pub struct QaScore {
    pub em: f64,
    pub f1: f64,
    pub verdict: Verdict,
}

/// SQuAD normalization: lowercase, drop ASCII punctuation, drop the articles a/an/the,
/// collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let without_punctuation: String = s.to_lowercase().chars().filter(|c| !c.is_ascii_punctuation()).collect();
    remove_articles(&without_punctuation).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Replaces every maximal run of word characters equal to `a`, `an` or `the` by a space,
/// which is what the regex `\b(a|an|the)\b` of the SQuAD script does.
fn remove_articles(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut word = String::new();
    for c in s.chars() {
        if is_word_char(c) {
            word.push(c);
            continue;
        }
        flush_word(&mut out, &mut word);
        out.push(c);
    }
    flush_word(&mut out, &mut word);
    out
}

fn flush_word(out: &mut String, word: &mut String) {
    if matches!(word.as_str(), "a" | "an" | "the") {
        out.push(' ');
    } else {
        out.push_str(word);
    }
    word.clear();
}

/// Python's `\w` on text: alphanumeric or underscore.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The key an alias is compared on: its SQuAD normal form, or its raw text when that is empty.
fn comparison_key(s: &str) -> String {
    let normalized = normalize_answer(s);
    if normalized.is_empty() {
        s.trim().to_lowercase()
    } else {
        normalized
    }
}

/// Whether the prediction equals any alias after normalization.
pub fn exact_match(prediction: &str, aliases: &[String]) -> bool {
    aliases.iter().any(|alias| matches_alias(prediction, alias))
}

fn matches_alias(prediction: &str, alias: &str) -> bool {
    if normalize_answer(alias).is_empty() {
        comparison_key(prediction) == comparison_key(alias)
    } else {
        normalize_answer(prediction) == normalize_answer(alias)
    }
}

/// The best token F1 of the prediction against any alias (0 with no aliases).
pub fn f1(prediction: &str, aliases: &[String]) -> f64 {
    aliases.iter().map(|alias| f1_against(prediction, alias)).fold(0.0, f64::max)
}

fn f1_against(prediction: &str, alias: &str) -> f64 {
    if normalize_answer(alias).is_empty() {
        return if matches_alias(prediction, alias) { 1.0 } else { 0.0 };
    }
    let predicted = normalize_answer(prediction);
    let gold = normalize_answer(alias);
    let all_or_nothing = |s: &str| ALL_OR_NOTHING_ANSWERS.contains(&s);
    if (all_or_nothing(&predicted) || all_or_nothing(&gold)) && predicted != gold {
        return 0.0;
    }
    token_f1(&predicted, &gold)
}

fn token_f1(predicted: &str, gold: &str) -> f64 {
    let predicted_tokens: Vec<&str> = predicted.split_whitespace().collect();
    let gold_tokens: Vec<&str> = gold.split_whitespace().collect();
    let mut gold_counts: HashMap<&str, usize> = HashMap::new();
    for token in &gold_tokens {
        *gold_counts.entry(token).or_default() += 1;
    }
    let mut shared = 0usize;
    for token in &predicted_tokens {
        if let Some(count) = gold_counts.get_mut(token).filter(|c| **c > 0) {
            *count -= 1;
            shared += 1;
        }
    }
    if shared == 0 {
        return 0.0;
    }
    let precision = shared as f64 / predicted_tokens.len() as f64;
    let recall = shared as f64 / gold_tokens.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Scores a prediction against the aliases; success means exact match, the reward follows `metric`.
pub fn score_against(prediction: &str, aliases: &[String], metric: RewardMetric) -> QaScore {
    if aliases.is_empty() {
        return QaScore { em: 0.0, f1: 0.0, verdict: Verdict::fail("the task has no answer aliases to compare with") };
    }
    let em = if exact_match(prediction, aliases) { 1.0 } else { 0.0 };
    let f1 = f1(prediction, aliases);
    let reward = match metric {
        RewardMetric::ExactMatch => em,
        RewardMetric::F1 => f1,
    };
    let detail = if em == 1.0 {
        format!("exact match: {prediction:?}")
    } else {
        format!("no exact match for {prediction:?} (F1 {f1:.3}); expected one of {aliases:?}")
    };
    QaScore { em, f1, verdict: Verdict { reward, success: em == 1.0, detail } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn aliases(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalization_follows_squad() {
        assert_eq!(normalize_answer("The Eiffel Tower!"), "eiffel tower");
        assert_eq!(normalize_answer("  an   apple, a pear "), "apple pear");
        assert_eq!(normalize_answer("Theater"), "theater");
        assert_eq!(normalize_answer("1,234"), "1234");
        assert_eq!(normalize_answer("l’a"), "l’");
    }

    #[test]
    fn degenerate_alias_needs_its_raw_text() {
        let gold = aliases(&["---"]);
        assert!(exact_match("---", &gold));
        assert!(!exact_match("", &gold));
        assert!(!exact_match("the", &gold));
        assert!(!exact_match("a", &aliases(&["A+"])));
        assert_eq!(f1("---", &gold), 1.0);
    }

    #[test]
    fn reward_follows_the_metric() {
        let gold = aliases(&["Paris France"]);
        let by_em = score_against("Paris", &gold, RewardMetric::ExactMatch);
        let by_f1 = score_against("Paris", &gold, RewardMetric::F1);
        assert_eq!(by_em.verdict.reward, 0.0);
        assert!((by_f1.verdict.reward - 2.0 / 3.0).abs() < 1e-12);
        assert!(!by_f1.verdict.success);
    }

    proptest! {
        #[test]
        fn f1_is_at_least_exact_match(pred in "[a-zA-Z ,.!-]{0,20}", gold in "[a-zA-Z ,.!-]{0,20}") {
            let gold = vec![gold];
            let em = if exact_match(&pred, &gold) { 1.0 } else { 0.0 };
            let f = f1(&pred, &gold);
            prop_assert!(f >= em);
            prop_assert!((0.0..=1.0).contains(&f));
        }
    }
}
