//! Why a study stopped: a comparison or coupling matrix that failed, a file it could not read
//! or write, or a result file that is not this study's.

use crate::compare::CompareError;
use crate::coupling::CouplingError;
use crate::figures::FigureError;
use crate::report::ReportError;
use std::path::PathBuf;
use whale_loop::lock::LockError;

#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("{config}, seed {seed}: {source}")]
    Compare { config: String, seed: u64, source: Box<CompareError> },
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("{config}, seed {seed}, the coupling matrix: {source}")]
    Coupling { config: String, seed: u64, source: Box<CouplingError> },
    #[error(transparent)]
    Figure(#[from] FigureError),
    #[error("writing {}: {reason}", path.display())]
    Write { path: PathBuf, reason: String },
    #[error("reading {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error(
        "{} is not this study's: {reason}; move it out of the results directory, or run the study it \
         came from",
        path.display()
    )]
    Refused { path: PathBuf, reason: String },
    #[error(
        "{}: {reason}; a study compares the arms of a seed test task by test task, so it is refused",
        path.display()
    )]
    Unpaired { path: PathBuf, reason: String },
    #[error("not writing {}: {reason}; a study could not read it back", path.display())]
    Unwritable { path: PathBuf, reason: String },
    #[error("config `{config}`: its portable form: {reason}")]
    Portable { config: String, reason: String },
    #[error("two configs are both named `{0}`: a study keeps one directory per config name")]
    DuplicateName(String),
    #[error("the condition `{0}` is given twice: a study runs each arm once per seed")]
    DuplicateArm(String),
    #[error("seed {0} is given twice: a seed counts once")]
    DuplicateSeed(u64),
    #[error(
        "config `{0}`: `[weights] keep_phase_weights = false`, but the study scores every harness a \
         WHALE run accepted under the weights of each of its phases (the coupling matrix), which that \
         setting throws away; set it to true (a merged copy of the model per weight phase; it changes \
         what a run keeps, not what it computes), or leave whale out with --conditions"
    )]
    PhaseWeightsOff(String),
    #[error(transparent)]
    Lock(#[from] LockError),
}
