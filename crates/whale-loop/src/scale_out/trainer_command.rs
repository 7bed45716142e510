//! The external trainer command of `[weights.trainer]`: its settings, its argument placeholders,
//! running it under a deadline with its output in a log, and checking what it wrote.
//!
//! Why a command: on a GPU cluster the weight phase is best done by the PyTorch stack the user
//! already runs (TRL, accelerate with DeepSpeed or FSDP, torchrun); whale only hands it the
//! step's samples and waits for the adapter or checkpoint it writes. Everything the command
//! needs arrives through placeholders in its arguments, so any script fits without a wrapper.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The placeholders a command's arguments and environment may use.
pub const PLACEHOLDERS: [&str; 7] = ["data", "base", "previous", "output", "metrics", "step", "run_dir"];

/// What the trainer writes into `{output}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainerOutput {
    /// A PEFT LoRA adapter: `adapter_config.json` and `adapter_model.safetensors`.
    Adapter,
    /// A full Hugging Face checkpoint: `config.json` and `*.safetensors`.
    Checkpoint,
}

impl TrainerOutput {
    /// The directory name of a step's output.
    pub fn dir_name(self) -> &'static str {
        match self {
            TrainerOutput::Adapter => "adapter",
            TrainerOutput::Checkpoint => "checkpoint",
        }
    }
}

/// `[weights.trainer]`: the weight phase's training runs as this command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerCommandConfig {
    /// The program and its arguments, with placeholders: `{data}` (the step's samples.jsonl),
    /// `{base}`, `{previous}` (the last update's output directory; empty before the first),
    /// `{output}` (where to write), `{metrics}` (where the trainer may write `{"loss": x}`, shown
    /// in the weight step's line and metrics row), `{step}`, `{run_dir}`; `{{` and `}}` are
    /// literal braces.
    pub command: Vec<String>,
    pub output: TrainerOutput,
    /// Seconds the command may run before it is stopped and the step fails.
    pub timeout_s: f64,
    /// Seconds to wait, after the command exits, for its output to appear (a shared
    /// filesystem may show files late).
    pub output_wait_s: f64,
    /// What `{base}` expands to: the base model as the trainer loads it (a directory or a hub
    /// id); absent: `server.model` under `[server]`, else `model.path` (the default base model
    /// when that is absent too). With `output = "checkpoint"` on a server, a run's first
    /// weights are reloaded from it.
    pub base: Option<String>,
    /// Extra environment variables of the command (placeholders allowed in the values).
    pub env: BTreeMap<String, String>,
    /// The command's working directory; absent: the config file's directory.
    pub workdir: Option<PathBuf>,
}

impl Default for TrainerCommandConfig {
    fn default() -> Self {
        Self {
            command: Vec::new(),
            output: TrainerOutput::Adapter,
            timeout_s: 86_400.0,
            output_wait_s: 60.0,
            base: None,
            env: BTreeMap::new(),
            workdir: None,
        }
    }
}

impl TrainerCommandConfig {
    /// Checks the table; the error names the key at fault (`weights.trainer.<key>`).
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let key = "weights.trainer.command";
        if self.command.first().is_none_or(|program| program.trim().is_empty()) {
            return Err((key, "needs a program to run".to_string()));
        }
        let known = |_: &str| Some(String::new());
        for argument in &self.command {
            expand(argument, known).map_err(|reason| (key, format!("`{argument}`: {reason}")))?;
        }
        for (name, value) in &self.env {
            expand(value, known).map_err(|reason| ("weights.trainer.env", format!("{name}: {reason}")))?;
        }
        let uses = |placeholder: &str| {
            let needle = format!("{{{placeholder}}}");
            self.command.iter().chain(self.env.values()).any(|text| text.contains(&needle))
        };
        for placeholder in ["data", "output"] {
            if !uses(placeholder) {
                return Err((key, format!("never passes {{{placeholder}}}, so the trainer cannot know it")));
            }
        }
        for (key, seconds) in
            [("weights.trainer.timeout_s", self.timeout_s), ("weights.trainer.output_wait_s", self.output_wait_s)]
        {
            if !(seconds.is_finite() && (0.0..=MAX_SECONDS).contains(&seconds)) {
                return Err((key, format!("must be a number of seconds from 0 to {MAX_SECONDS}")));
            }
        }
        if self.timeout_s == 0.0 {
            return Err(("weights.trainer.timeout_s", "must be positive".to_string()));
        }
        Ok(())
    }
}

/// The longest wait a setting may ask for (a year), so that no deadline overflows.
pub const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// The values of the placeholders for one run of the command.
#[derive(Debug, Clone, PartialEq)]
pub struct Placeholders {
    pub data: PathBuf,
    pub base: String,
    pub previous: Option<PathBuf>,
    pub output: PathBuf,
    pub metrics: PathBuf,
    pub step: u64,
    pub run_dir: PathBuf,
}

impl Placeholders {
    fn value(&self, name: &str) -> Option<String> {
        let path = |p: &Path| p.display().to_string();
        Some(match name {
            "data" => path(&self.data),
            "base" => self.base.clone(),
            "previous" => self.previous.as_deref().map(path).unwrap_or_default(),
            "output" => path(&self.output),
            "metrics" => path(&self.metrics),
            "step" => self.step.to_string(),
            "run_dir" => path(&self.run_dir),
            _ => return None,
        })
    }
}

/// `text` with every `{name}` replaced by `lookup(name)`; `{{` and `}}` are literal braces.
pub fn expand(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            return Err("a lone `}` (write `}}` for a literal brace)".to_string());
        }
        let close = tail.find('}').ok_or("an unclosed `{` (write `{{` for a literal brace)")?;
        let name = &tail[1..close];
        let value = lookup(name)
            .filter(|_| PLACEHOLDERS.contains(&name))
            .ok_or_else(|| format!("unknown placeholder {{{name}}} (known: {})", PLACEHOLDERS.join(", ")))?;
        out.push_str(&value);
        rest = &tail[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Why a run of the trainer command did not produce new weights.
#[derive(Debug, thiserror::Error)]
pub enum TrainerCommandError {
    #[error("weight step {step}: cannot start `{program}`: {source}")]
    Spawn { step: u64, program: String, source: std::io::Error },
    #[error("weight step {step}: the trainer command failed ({status}); see {}", log.display())]
    Failed { step: u64, status: ExitStatus, log: PathBuf },
    #[error("weight step {step}: the trainer command ran past its {timeout_s} s and was stopped; see {}", log.display())]
    TimedOut { step: u64, timeout_s: f64, log: PathBuf },
    #[error("weight step {step}: the trainer wrote no {} into {} (missing: {}); see {}", kind.dir_name(), dir.display(), missing.join(", "), log.display())]
    MissingOutput { step: u64, kind: TrainerOutput, dir: PathBuf, missing: Vec<String>, log: PathBuf },
    #[error("weight step {step}: {}: {reason}; see {}", file.display(), log.display())]
    BadOutput { step: u64, file: PathBuf, reason: String, log: PathBuf },
    #[error("weight step {step}: the trainer command: {reason}")]
    Placeholder { step: u64, reason: String },
    #[error("weight step {step}: {}: {source}", path.display())]
    Io { step: u64, path: PathBuf, source: std::io::Error },
}

/// One run of the command: where its log goes and whether to show progress.
pub struct TrainerRun<'a> {
    pub config: &'a TrainerCommandConfig,
    pub placeholders: &'a Placeholders,
    pub log: &'a Path,
    pub progress: bool,
}

/// Seconds between two looks at the running command.
const POLL: Duration = Duration::from_millis(100);
/// How long a command asked to stop (SIGTERM, which launchers pass on to their workers) has
/// before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl TrainerRun<'_> {
    /// Runs the command to its end (stdout and stderr into the log), then waits for its output;
    /// returns the seconds it took.
    pub fn run(&self) -> Result<f64, TrainerCommandError> {
        let step = self.placeholders.step;
        let started = Instant::now();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TrainerCommandError::Io { step, path, source }
        };
        let output = &self.placeholders.output;
        if output.exists() {
            fs::remove_dir_all(output).map_err(io(output))?;
        }
        if let Some(parent) = output.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let log = File::create(self.log).map_err(io(self.log))?;
        let mut child = self.command(log)?.spawn().map_err(|source| TrainerCommandError::Spawn {
            step,
            program: self.config.command[0].clone(),
            source,
        })?;
        let status = self.wait(&mut child, started)?;
        let log = self.log.to_path_buf();
        match status {
            None => return Err(TrainerCommandError::TimedOut { step, timeout_s: self.config.timeout_s, log }),
            Some(status) if !status.success() => return Err(TrainerCommandError::Failed { step, status, log }),
            Some(_) => {}
        }
        self.await_output()?;
        Ok(started.elapsed().as_secs_f64())
    }

    fn command(&self, log: File) -> Result<Command, TrainerCommandError> {
        let step = self.placeholders.step;
        let values = |name: &str| self.placeholders.value(name);
        let bad = |reason: String| TrainerCommandError::Placeholder { step, reason };
        let argv: Vec<String> =
            self.config.command.iter().map(|a| expand(a, values)).collect::<Result<_, _>>().map_err(bad)?;
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        for (name, value) in &self.config.env {
            command.env(name, expand(value, values).map_err(bad)?);
        }
        if let Some(dir) = &self.config.workdir {
            command.current_dir(dir);
        }
        let errors =
            log.try_clone().map_err(|source| TrainerCommandError::Io { step, path: self.log.to_path_buf(), source })?;
        command.stdin(Stdio::null()).stdout(log).stderr(errors);
        // Its own process group, so that stopping it reaches the workers a launcher
        // (torchrun, accelerate) starts too.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        #[cfg(target_os = "linux")]
        stop_with_parent(&mut command);
        Ok(command)
    }

    /// Waits for the command to exit; `None` when it ran past the deadline and was stopped.
    fn wait(&self, child: &mut Child, started: Instant) -> Result<Option<ExitStatus>, TrainerCommandError> {
        let step = self.placeholders.step;
        let deadline = started + Duration::from_secs_f64(self.config.timeout_s);
        let spinner = self.progress.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} weight step {prefix}: trainer {elapsed} {wide_msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.set_prefix(step.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let waited = loop {
            let polled = child.try_wait().map_err(|source| TrainerCommandError::Io {
                step,
                path: PathBuf::from(&self.config.command[0]),
                source,
            })?;
            if let Some(status) = polled {
                break Some(status);
            }
            if Instant::now() >= deadline {
                stop(child);
                break None;
            }
            if let Some(bar) = &spinner {
                bar.set_message(last_line(self.log));
            }
            std::thread::sleep(POLL);
        };
        if let Some(bar) = spinner {
            bar.finish_and_clear();
        }
        Ok(waited)
    }

    /// Waits up to `output_wait_s` for the output files, then checks they are complete.
    fn await_output(&self) -> Result<(), TrainerCommandError> {
        let step = self.placeholders.step;
        let dir = &self.placeholders.output;
        let kind = self.config.output;
        let deadline = Instant::now() + Duration::from_secs_f64(self.config.output_wait_s);
        let files = loop {
            match output_files(dir, kind) {
                Ok(files) => break files,
                Err(missing) if Instant::now() >= deadline => {
                    let log = self.log.to_path_buf();
                    return Err(TrainerCommandError::MissingOutput { step, kind, dir: dir.clone(), missing, log });
                }
                Err(_) => std::thread::sleep(POLL),
            }
        };
        for file in files {
            check_safetensors(&file).map_err(|reason| TrainerCommandError::BadOutput {
                step,
                file: file.clone(),
                reason,
                log: self.log.to_path_buf(),
            })?;
        }
        Ok(())
    }
}

/// Has the command asked to stop (SIGTERM) when whale dies, even by SIGKILL, so that a resumed
/// run's new attempt at the step does not race an orphan writing into the same `{output}`. The
/// signal comes when the thread that started the command ends: whale starts it from the thread
/// that runs the experiment and waits for it there.
#[cfg(target_os = "linux")]
fn stop_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let ask_to_stop = || {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
            .map_err(std::io::Error::from)
    };
    // SAFETY: the closure runs in the child between fork and exec; it makes one system call
    // (prctl), which is async-signal-safe, and touches no memory of the parent.
    unsafe {
        command.pre_exec(ask_to_stop);
    }
}

/// Asks the command's process group (the command and any workers it started) to stop, then
/// kills the group if the command has not exited within the grace period.
fn stop(child: &mut Child) {
    let group = rustix::process::Pid::from_child(child);
    if rustix::process::kill_process_group(group, rustix::process::Signal::TERM).is_ok() {
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(POLL);
        }
    }
    // The command may have exited in the meantime; either way it is gone after this.
    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    let _ = child.kill();
    let _ = child.wait();
}

/// The last non-empty line of a log (progress bars redraw with `\r`), for the spinner.
fn last_line(log: &Path) -> String {
    let mut tail = Vec::new();
    if let Ok(mut file) = File::open(log) {
        let length = file.metadata().map_or(0, |m| m.len());
        let _ = file.seek(SeekFrom::Start(length.saturating_sub(2048)));
        let _ = file.read_to_end(&mut tail);
    }
    let text = String::from_utf8_lossy(&tail);
    let line = text.split(['\n', '\r']).rev().find(|line| !line.trim().is_empty()).unwrap_or_default();
    line.trim().chars().take(120).collect()
}

/// The safetensors files of a complete output in `dir`, or the names of what is missing.
pub fn output_files(dir: &Path, kind: TrainerOutput) -> Result<Vec<PathBuf>, Vec<String>> {
    let (config, weights) = match kind {
        TrainerOutput::Adapter => ("adapter_config.json", Some("adapter_model.safetensors")),
        TrainerOutput::Checkpoint => ("config.json", None),
    };
    let mut missing = Vec::new();
    if !dir.join(config).is_file() {
        missing.push(config.to_string());
    }
    let files: Vec<PathBuf> = match weights {
        Some(name) => [dir.join(name)].into_iter().filter(|path| path.is_file()).collect(),
        None => fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok().map(|e| e.path()))
                    .filter(|path| path.extension().is_some_and(|e| e == "safetensors"))
                    .collect()
            })
            .unwrap_or_default(),
    };
    if files.is_empty() {
        missing.push(weights.unwrap_or("*.safetensors").to_string());
    }
    if kind == TrainerOutput::Checkpoint {
        missing.extend(missing_shards(dir));
    }
    if missing.is_empty() {
        Ok(files)
    } else {
        Err(missing)
    }
}

/// The index of a sharded checkpoint, naming the file of every tensor.
const SHARD_INDEX_FILE: &str = "model.safetensors.index.json";

/// The shards a sharded checkpoint's index names that are not (yet) in `dir`; an unreadable
/// index counts as missing, since the writer may still be at it.
fn missing_shards(dir: &Path) -> Vec<String> {
    let index = dir.join(SHARD_INDEX_FILE);
    if !index.is_file() {
        return Vec::new();
    }
    let parsed: Option<serde_json::Value> = fs::read(&index).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let Some(map) = parsed.as_ref().and_then(|index| index["weight_map"].as_object()) else {
        return vec![SHARD_INDEX_FILE.to_string()];
    };
    let shards: std::collections::BTreeSet<&str> = map.values().filter_map(serde_json::Value::as_str).collect();
    shards.into_iter().filter(|shard| !dir.join(shard).is_file()).map(str::to_string).collect()
}

/// Checks that a safetensors file is whole: its JSON header parses and the file is exactly as
/// long as the header's tensors say (a file still being written, or cut short, is not).
pub fn check_safetensors(path: &Path) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let length = file.metadata().map_err(|e| e.to_string())?.len();
    let mut size = [0u8; 8];
    file.read_exact(&mut size).map_err(|_| "shorter than a safetensors header".to_string())?;
    let header_len = u64::from_le_bytes(size);
    if header_len > length.saturating_sub(8) {
        return Err(format!("its header claims {header_len} bytes of a {length}-byte file"));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format!("its header is not a JSON object: {e}"))?;
    let data_end = header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, tensor)| {
            tensor["data_offsets"][1].as_u64().ok_or_else(|| format!("tensor `{name}` has no data_offsets"))
        })
        .try_fold(0u64, |end, offset| offset.map(|o| end.max(o)))?;
    let expected = data_end.checked_add(8).and_then(|end| end.checked_add(header_len));
    if expected != Some(length) {
        let expected = expected.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string());
        return Err(format!("{length} bytes where its header describes {expected}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(name: &str) -> Option<String> {
        Some(format!("<{name}>"))
    }

    #[test]
    fn placeholders_expand_and_braces_escape() {
        assert_eq!(expand("--data={data}", values).as_deref(), Ok("--data=<data>"));
        assert_eq!(expand("{{step}} is {step}", values).as_deref(), Ok("{step} is <step>"));
        assert_eq!(expand("no braces", values).as_deref(), Ok("no braces"));
        assert!(expand("{steps}", values).expect_err("unknown").contains("unknown placeholder {steps}"));
        assert!(expand("{data", values).expect_err("unclosed").contains("unclosed"));
        assert!(expand("a}", values).expect_err("lone").contains("lone"));
    }

    #[test]
    fn the_previous_output_is_empty_before_the_first_update() {
        let mut placeholders = Placeholders {
            data: PathBuf::from("/r/weights/step-000001/samples.jsonl"),
            base: "Qwen/Qwen3-8B".to_string(),
            previous: None,
            output: PathBuf::from("/r/weights/step-000001/adapter"),
            metrics: PathBuf::from("/r/weights/step-000001/trainer_metrics.json"),
            step: 1,
            run_dir: PathBuf::from("/r"),
        };
        let expanded = |p: &Placeholders, text: &str| expand(text, |name| p.value(name));
        assert_eq!(expanded(&placeholders, "[{previous}]").as_deref(), Ok("[]"));
        placeholders.previous = Some(PathBuf::from("/r/weights/step-000001/adapter"));
        assert_eq!(expanded(&placeholders, "{previous}").as_deref(), Ok("/r/weights/step-000001/adapter"));
        assert_eq!(expanded(&placeholders, "{base} {step}").as_deref(), Ok("Qwen/Qwen3-8B 1"));
    }

    #[test]
    fn a_command_must_pass_its_data_and_output() {
        let config = |argv: &[&str]| TrainerCommandConfig {
            command: argv.iter().map(|a| a.to_string()).collect(),
            ..TrainerCommandConfig::default()
        };
        assert_eq!(config(&["train", "{data}", "{output}"]).validate(), Ok(()));
        let (key, reason) = config(&["train", "{data}"]).validate().expect_err("no output");
        assert_eq!(key, "weights.trainer.command");
        assert!(reason.contains("{output}"), "{reason}");
        let (_, reason) = config(&["train", "{data}", "{out}"]).validate().expect_err("typo");
        assert!(reason.contains("unknown placeholder {out}"), "{reason}");
        assert_eq!(config(&[]).validate().map_err(|(k, _)| k), Err("weights.trainer.command"));
        let mut timeout = config(&["t", "{data}", "{output}"]);
        timeout.timeout_s = 0.0;
        assert_eq!(timeout.validate().map_err(|(k, _)| k), Err("weights.trainer.timeout_s"));
        timeout.timeout_s = 1e20;
        assert_eq!(timeout.validate().map_err(|(k, _)| k), Err("weights.trainer.timeout_s"));
    }

    fn safetensors(path: &Path, data: &[u8], claimed: usize) {
        let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{claimed}]}}}}"#, claimed / 4);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        fs::write(path, bytes).expect("write");
    }

    #[test]
    fn a_whole_safetensors_file_passes_and_a_cut_one_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("adapter_model.safetensors");
        safetensors(&path, &[0u8; 16], 16);
        assert_eq!(check_safetensors(&path), Ok(()));
        safetensors(&path, &[0u8; 12], 16);
        assert!(check_safetensors(&path).expect_err("cut").contains("header describes"));
        fs::write(&path, b"abc").expect("write");
        assert!(check_safetensors(&path).is_err());
        safetensors(&path, &[0u8; 16], usize::MAX);
        assert!(check_safetensors(&path).expect_err("overflowing offsets").contains("more than 2^64"));
    }

    #[test]
    fn missing_output_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            output_files(dir.path(), TrainerOutput::Adapter),
            Err(vec!["adapter_config.json".to_string(), "adapter_model.safetensors".to_string()])
        );
        fs::write(dir.path().join("config.json"), "{}").expect("write");
        assert_eq!(output_files(dir.path(), TrainerOutput::Checkpoint), Err(vec!["*.safetensors".to_string()]));
        fs::write(dir.path().join("model-00001-of-00002.safetensors"), "").expect("write");
        assert_eq!(output_files(dir.path(), TrainerOutput::Checkpoint).map(|f| f.len()), Ok(1));
        let index =
            r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
        fs::write(dir.path().join(SHARD_INDEX_FILE), index).expect("write");
        assert_eq!(
            output_files(dir.path(), TrainerOutput::Checkpoint),
            Err(vec!["model-00002-of-00002.safetensors".to_string()])
        );
        fs::write(dir.path().join("model-00002-of-00002.safetensors"), "").expect("write");
        assert_eq!(output_files(dir.path(), TrainerOutput::Checkpoint).map(|f| f.len()), Ok(2));
    }
}
