//! The command proposer: any coding-agent CLI, run with `sh -c` in a scratch copy of the
//! archive (so it can read everything and break nothing). It learns its task from
//! `request.json` and `WHALE_*` variables, and answers with `pending.json`:
//! `[{"file": "new/harness.js" | "source": "...", "hypothesis": "...", "parent": "c0003"?}]`,
//! files named relative to the scratch directory. A non-zero exit, a timeout, or a missing
//! or malformed `pending.json` is an error, and the run of the command is kept in
//! `sessions/<iteration>.json`.

use super::confine::ConfinedDir;
use super::{Proposal, ProposalContext, Proposer, ProposerError};
use crate::durable::{self, PARTIAL_PREFIX};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Characters of the command's output kept in the session record.
const OUTPUT_TAIL_CHARS: usize = 4_000;
/// How often a running command is polled.
const POLL: Duration = Duration::from_millis(20);

/// The command to run and how long it may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// A shell command line (`sh -c`), run in the scratch copy of the archive.
    pub command: String,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
}

fn default_timeout_s() -> u64 {
    1_800
}

/// One entry of `pending.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pending {
    file: Option<String>,
    source: Option<String>,
    hypothesis: String,
    parent: Option<String>,
}

pub struct CommandProposer {
    config: CommandConfig,
}

impl CommandProposer {
    pub fn new(config: CommandConfig) -> Self {
        Self { config }
    }
}

impl Proposer for CommandProposer {
    fn name(&self) -> &str {
        "command"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>) -> Result<Vec<Proposal>, ProposerError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| ProposerError::Io { context, source }
        };
        let scratch = tempfile::Builder::new().prefix("whale-proposer-").tempdir().map_err(io("scratch directory"))?;
        let logs = tempfile::Builder::new().prefix("whale-proposer-logs-").tempdir().map_err(io("log directory"))?;
        copy_tree(ctx.archive, scratch.path()).map_err(io("copying the archive"))?;
        let request = json!({
            "iteration": ctx.iteration, "domain": ctx.domain, "candidates": ctx.candidates,
            "weights_version": ctx.weights_version, "seed": ctx.seed,
            "incumbent": {"id": ctx.incumbent.meta.id, "hash": ctx.incumbent.meta.hash,
                          "path": format!("candidates/{}/harness.js", ctx.incumbent.meta.id)},
            "answer_in": "pending.json",
        });
        fs::write(scratch.path().join("request.json"), request.to_string()).map_err(io("request.json"))?;
        let started = Instant::now();
        let run = self.run(ctx, scratch.path(), logs.path());
        let tail = |name: &str| tail_of(&logs.path().join(name));
        let record = json!({
            "command": self.config.command, "iteration": ctx.iteration,
            "seconds": started.elapsed().as_secs_f64(),
            "status": run.as_ref().ok().and_then(|s| s.code()), "error": run.as_ref().err().map(ToString::to_string),
            "stdout_tail": tail("stdout"), "stderr_tail": tail("stderr"),
        });
        let path = ctx.session_path("json");
        durable::write_file(&path, record.to_string().as_bytes()).map_err(io("session record"))?;
        let status = run?;
        if !status.success() {
            return Err(ProposerError::Command(format!("exited with {status}: {}", tail("stderr"))));
        }
        read_pending(scratch.path(), &ctx.incumbent.meta.id)
    }
}

impl CommandProposer {
    fn run(&self, ctx: &ProposalContext<'_>, dir: &Path, logs: &Path) -> Result<ExitStatus, ProposerError> {
        let io = |context: &'static str| move |source| ProposerError::Io { context: context.to_string(), source };
        let stdout = fs::File::create(logs.join("stdout")).map_err(io("stdout log"))?;
        let stderr = fs::File::create(logs.join("stderr")).map_err(io("stderr log"))?;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&self.config.command)
            .current_dir(dir)
            .env("WHALE_ARCHIVE", dir)
            .env("WHALE_ITERATION", ctx.iteration.to_string())
            .env("WHALE_CANDIDATES", ctx.candidates.to_string())
            .env("WHALE_INCUMBENT", &ctx.incumbent.meta.id)
            .env("WHALE_DOMAIN", ctx.domain.as_str())
            .env("WHALE_SEED", ctx.seed.to_string())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(io("starting `sh -c`"))?;
        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_s);
        loop {
            if let Some(status) = child.try_wait().map_err(io("waiting for the command"))? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                stop(&mut child);
                return Err(ProposerError::Command(format!("timed out after {} s", self.config.timeout_s)));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Kills the command and everything it started (its process group).
fn stop(child: &mut Child) {
    #[cfg(unix)]
    {
        let group = rustix::process::Pid::from_child(child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn read_pending(dir: &Path, incumbent: &str) -> Result<Vec<Proposal>, ProposerError> {
    let text = fs::read_to_string(dir.join("pending.json"))
        .map_err(|e| ProposerError::Pending(format!("cannot read it: {e}")))?;
    let entries: Vec<Pending> =
        serde_json::from_str(&text).map_err(|e| ProposerError::Pending(format!("not a list of candidates: {e}")))?;
    let confined = ConfinedDir::new(dir).map_err(|source| ProposerError::Io { context: "scratch".into(), source })?;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let source = match (entry.source, entry.file) {
                (Some(source), None) => source,
                (None, Some(file)) => {
                    let path =
                        confined.resolve(&file).map_err(|e| ProposerError::Pending(format!("entry {i}: {e}")))?;
                    fs::read_to_string(&path).map_err(|e| ProposerError::Pending(format!("entry {i}: {file}: {e}")))?
                }
                _ => return Err(ProposerError::Pending(format!("entry {i} needs exactly one of `file` and `source`"))),
            };
            let parent = Some(entry.parent.unwrap_or_else(|| incumbent.to_string()));
            Ok(Proposal { source, hypothesis: entry.hypothesis, parent })
        })
        .collect()
}

/// Copies `from` into `to`, leaving out symbolic links and partly written entries.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(PARTIAL_PREFIX) {
            continue;
        }
        let kind = entry.file_type()?;
        let target = to.join(&name);
        if kind.is_dir() {
            fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn tail_of(path: &Path) -> String {
    let text = fs::read(path).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default();
    let skip = text.chars().count().saturating_sub(OUTPUT_TAIL_CHARS);
    text.chars().skip(skip).collect()
}
