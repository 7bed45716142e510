//! A task: one problem of one domain, as loaded from a file or generated.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The three domains whale knows.
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
        match s.to_ascii_lowercase().as_str() {
            "math" => Ok(Domain::Math),
            "chess" => Ok(Domain::Chess),
            "qa" => Ok(Domain::Qa),
            other => Err(format!("unknown domain `{other}` (expected math, chess or qa)")),
        }
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
