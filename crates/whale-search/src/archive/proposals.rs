//! What a search's proposers did, read back from the archive's summary: proposals made, how
//! many validated, why the others were rejected, how many were accepted, the best search score
//! reached and the proposers' own failures. It is how two proposers are compared at the same
//! rollout budget, and how a run says how many proposals failed and why.

use super::SummaryEvent;
use std::collections::BTreeMap;
use std::fmt;

/// Characters of a proposer failure's message shown in the text form.
const FAILURE_CHARS: usize = 240;

/// The proposers' record over a whole archive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProposalRecord {
    /// The names of the proposers that wrote candidates (the seed excluded), in order of first use.
    pub proposers: Vec<String>,
    pub iterations_concluded: u64,
    pub proposed: usize,
    /// Proposals that passed validation and their smoke rollout.
    pub valid: usize,
    /// Valid proposals whose source had been scored already under those weights (no rollout ran).
    pub repeats: usize,
    /// Why the others were rejected: the kind of reason (its text up to the detail) and a count.
    pub rejected: BTreeMap<String, usize>,
    /// Iterations whose candidate became the incumbent.
    pub accepted: usize,
    /// Iterations whose proposer failed: the iteration and the error.
    pub failures: Vec<(u64, String)>,
    /// Under each weights version: the incumbent's first score and the best score of any
    /// harness scored on the search tasks.
    pub success: BTreeMap<u64, (f64, f64)>,
}

impl ProposalRecord {
    pub fn from_events(events: &[SummaryEvent]) -> Self {
        let mut record = Self::default();
        for event in events {
            record.add(event);
        }
        record
    }

    fn add(&mut self, event: &SummaryEvent) {
        match event {
            SummaryEvent::Proposed { proposer, rejection, .. } => {
                if !self.proposers.contains(proposer) {
                    self.proposers.push(proposer.clone());
                }
                self.proposed += 1;
                match rejection {
                    Some(reason) => *self.rejected.entry(reason_kind(reason)).or_default() += 1,
                    None => self.valid += 1,
                }
            }
            SummaryEvent::Scored { weights_version, objectives, reused, .. } => {
                self.repeats += usize::from(*reused);
                self.scored(*weights_version, objectives.success);
            }
            SummaryEvent::Rescored { weights_version, objectives, .. } => {
                self.scored(*weights_version, objectives.success)
            }
            SummaryEvent::Concluded { new_best, .. } => {
                self.iterations_concluded += 1;
                self.accepted += usize::from(*new_best);
            }
            SummaryEvent::ProposerFailed { iteration, error, .. } => self.failures.push((*iteration, error.clone())),
            SummaryEvent::Seeded { .. } => {}
        }
    }

    fn scored(&mut self, version: u64, success: f64) {
        let (_, best) = self.success.entry(version).or_insert((success, success));
        *best = best.max(success);
    }
}

/// A rejection's kind: its text up to the detail ("does not validate: the harness does not
/// compile", "its smoke rollout failed (Timeout)").
fn reason_kind(rejection: &str) -> String {
    let parts = if rejection.starts_with("does not validate: ") { 2 } else { 1 };
    rejection.splitn(parts + 1, ": ").take(parts).collect::<Vec<_>>().join(": ")
}

impl fmt::Display for ProposalRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = if self.proposers.is_empty() { "none".to_string() } else { self.proposers.join(", ") };
        writeln!(f, "proposer: {names}; iterations concluded: {}", self.iterations_concluded)?;
        let share = if self.proposed == 0 { 0.0 } else { 100.0 * self.valid as f64 / self.proposed as f64 };
        writeln!(
            f,
            "proposals: {} made, {} valid ({share:.0}%; {} of them already scored), {} accepted",
            self.proposed, self.valid, self.repeats, self.accepted
        )?;
        for (reason, count) in &self.rejected {
            writeln!(f, "  rejected {count:>3}: {reason}")?;
        }
        writeln!(f, "proposer failures: {}", self.failures.len())?;
        for (iteration, error) in &self.failures {
            let shown: String = error.chars().take(FAILURE_CHARS).collect();
            let more = if error.chars().count() > FAILURE_CHARS { " [...]" } else { "" };
            writeln!(f, "  iteration {iteration}: {shown}{more}")?;
        }
        for (version, (start, best)) in &self.success {
            writeln!(f, "search success under weights {version}: start {start:.3}, best {best:.3}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::CandidateRef;
    use whale_core::Objectives;

    fn at(success: f64) -> Objectives {
        Objectives { success, mean_turns: 1.0, mean_tokens: 10.0 }
    }

    fn proposed(hash: &str, rejection: Option<&str>) -> SummaryEvent {
        SummaryEvent::Proposed {
            iteration: 1,
            candidate: CandidateRef { id: hash.into(), hash: hash.into() },
            parent: None,
            hypothesis: String::new(),
            proposer: "one-shot".into(),
            rejection: rejection.map(str::to_string),
            rollouts: 1,
        }
    }

    fn scored(hash: &str, success: f64, reused: bool) -> SummaryEvent {
        let candidate = CandidateRef { id: hash.into(), hash: hash.into() };
        SummaryEvent::Scored {
            iteration: 1,
            candidate,
            weights_version: 0,
            objectives: at(success),
            reused,
            rollouts: 4,
        }
    }

    #[test]
    fn the_record_counts_proposals_by_fate_and_keeps_the_best_score_per_weights() {
        let seed = CandidateRef { id: "c0".into(), hash: "h0".into() };
        let events = vec![
            SummaryEvent::Seeded { candidate: seed.clone() },
            SummaryEvent::Rescored {
                candidate: seed.clone(),
                weights_version: 0,
                objectives: at(0.25),
                reused: false,
                rollouts: 4,
            },
            proposed("a", None),
            scored("a", 0.5, false),
            proposed("b", Some("does not validate: the harness does not compile: SyntaxError at 3:1")),
            proposed("c", Some("does not validate: the harness does not compile: unexpected token")),
            proposed("d", Some("its smoke rollout failed (Timeout): 30 s")),
            proposed("e", None),
            scored("e", 0.125, true),
            SummaryEvent::Concluded { iteration: 1, weights_version: 0, incumbent: seed.clone(), new_best: true },
            SummaryEvent::ProposerFailed { iteration: 2, proposer: "one-shot".into(), error: "x".repeat(300) },
            SummaryEvent::Concluded { iteration: 2, weights_version: 0, incumbent: seed, new_best: false },
        ];
        let record = ProposalRecord::from_events(&events);
        assert_eq!(record.proposers, ["one-shot"]);
        assert_eq!((record.proposed, record.valid, record.repeats, record.accepted), (5, 2, 1, 1));
        assert_eq!(record.iterations_concluded, 2);
        assert_eq!(record.rejected["does not validate: the harness does not compile"], 2);
        assert_eq!(record.rejected["its smoke rollout failed (Timeout)"], 1);
        assert_eq!(record.success[&0], (0.25, 0.5));
        let text = record.to_string();
        assert!(text.contains("5 made, 2 valid (40%; 1 of them already scored), 1 accepted"), "{text}");
        assert!(text.contains("rejected   2: does not validate: the harness does not compile"), "{text}");
        assert!(text.contains("iteration 2: xxx") && text.contains("[...]"), "{text}");
        assert!(text.contains("under weights 0: start 0.250, best 0.500"), "{text}");
    }
}
