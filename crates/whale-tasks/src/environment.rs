//! An environment: what all episodes of one run share (the chess retry budgets, the QA search
//! index), built once, and a fresh [`Episode`] for any task of its domain on demand.
//!
//! Each domain folder supplies its own [`EpisodeFactory`] through
//! [`TaskDomain::environment`](crate::TaskDomain::environment); this type only checks that a
//! task belongs to the environment's domain. [`Environment::for_tasks`] lives with the registry.

use crate::{chess, math, qa, Episode, RecordError};
use std::fmt;
use std::sync::Arc;
use whale_core::{Domain, Task};

/// What a domain's episodes share in a run, able to start a fresh episode of any of its tasks.
pub trait EpisodeFactory: fmt::Debug + Send + Sync {
    /// A fresh episode of `task` (already known to be of this domain), or why the task's
    /// payload cannot be played.
    fn episode(&self, task: &Task) -> Result<Box<dyn Episode>, EnvironmentError>;
    /// How many passages the episodes search, for a domain that searches a corpus.
    fn passages(&self) -> Option<u64>;
}

/// The environment of one domain.
#[derive(Debug, Clone)]
pub struct Environment {
    domain: Domain,
    episodes: Arc<dyn EpisodeFactory>,
}

/// Why an environment or one of its episodes could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    #[error("task `{id}` belongs to the {found} domain, not {expected}")]
    WrongDomain { id: String, found: Domain, expected: Domain },
    #[error(transparent)]
    Math(#[from] math::TaskError),
    #[error(transparent)]
    Chess(#[from] chess::TaskError),
    #[error("task `{id}` is not a QA task: {reason}")]
    Qa { id: String, reason: String },
    #[error("the QA corpus has {rejected} unreadable record(s), the first: {first}")]
    Corpus { rejected: usize, first: RecordError },
    #[error("cannot build the QA search index: {0}")]
    Index(#[from] qa::QaError),
}

impl Environment {
    /// The environment of `domain` whose episodes `episodes` makes.
    pub fn new(domain: Domain, episodes: impl EpisodeFactory + 'static) -> Self {
        Self { domain, episodes: Arc::new(episodes) }
    }

    pub fn domain(&self) -> Domain {
        self.domain
    }

    /// How many passages the episodes search, for a domain that searches a corpus.
    pub fn passages(&self) -> Option<u64> {
        self.episodes.passages()
    }

    /// A fresh episode of `task`, or why the task cannot be played here (another domain, a
    /// payload the domain cannot read).
    pub fn episode(&self, task: &Task) -> Result<Box<dyn Episode>, EnvironmentError> {
        if task.domain != self.domain {
            return Err(EnvironmentError::WrongDomain {
                id: task.id.clone(),
                found: task.domain,
                expected: self.domain,
            });
        }
        self.episodes.episode(task)
    }
}
