//! A task: one problem of one domain, as loaded from a file or generated.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The three domains whale knows, by the name files and configs spell. What a domain does is
/// `whale_tasks::TaskDomain`, found for an identifier by `whale_tasks::task_domain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    Math,
    Chess,
    Qa,
}

impl Domain {
    pub const ALL: [Domain; 3] = [Domain::Math, Domain::Chess, Domain::Qa];

    pub fn as_str(self) -> &'static str {
        match self {
            Domain::Math => "math",
            Domain::Chess => "chess",
            Domain::Qa => "qa",
        }
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Domain {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.to_ascii_lowercase();
        Domain::ALL.into_iter().find(|d| d.as_str() == name).ok_or_else(|| {
            let names: Vec<&str> = Domain::ALL.iter().map(|d| d.as_str()).collect();
            let (last, rest) = names.split_last().expect("at least one domain");
            format!("unknown domain `{name}` (expected {} or {last})", rest.join(", "))
        })
    }
}

/// Which subset of a dataset a task belongs to. Test tasks never reach the search archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Search,
    Test,
}

/// One problem. `payload` holds the domain's own fields (see `whale_tasks::<domain>`),
/// kept as JSON so that harness programs receive it unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub domain: Domain,
    pub payload: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_domain_parses_from_its_name_in_any_case_and_others_are_named_in_the_error() {
        for domain in Domain::ALL {
            assert_eq!(domain.as_str().parse::<Domain>(), Ok(domain));
            assert_eq!(domain.as_str().to_uppercase().parse::<Domain>(), Ok(domain));
        }
        assert_eq!("Poker".parse::<Domain>(), Err("unknown domain `poker` (expected math, chess or qa)".to_string()));
    }
}
