//! The CPU a run used: its model name, architecture and the vector instruction sets found at
//! run time.
//!
//! whale's figures depend on the CPU family: the matrix products pick their kernel at run time
//! from the instruction sets the CPU has (AVX2 and FMA, or AVX-512), the kernel fixes the order
//! in which each sum adds its floats, and over thousands of training steps those last bits grow
//! into another base model and other tables. `whale demo` and `whale study` print a [`CpuInfo`]
//! first, so that every table can be traced to the machine family it reproduces on.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The CPU's model name (`model name` of `/proc/cpuinfo`), its architecture, and which of
/// [`X86_FEATURES`] it has (none are listed off x86).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub model: String,
    pub arch: String,
    /// The features of [`X86_FEATURES`] detected, in that order.
    pub features: Vec<String>,
    /// The features of [`X86_FEATURES`] missing, in that order.
    pub missing: Vec<String>,
}

/// The x86 instruction sets reported, as `is_x86_feature_detected!` names them.
pub const X86_FEATURES: [&str; 5] = ["sse4.2", "avx", "avx2", "fma", "avx512f"];

/// The model name when `/proc/cpuinfo` cannot be read or does not name one.
pub const UNKNOWN_MODEL: &str = "unknown CPU";

impl CpuInfo {
    /// The CPU this process runs on.
    pub fn detect() -> CpuInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = model_name(&cpuinfo).unwrap_or_else(|| UNKNOWN_MODEL.to_string());
        let (features, missing) = detected_x86_features().into_iter().partition(|(_, detected)| *detected);
        CpuInfo { model, arch: std::env::consts::ARCH.to_string(), features: names(features), missing: names(missing) }
    }
}

/// `AMD EPYC 7B13 (x86_64, sse4.2, avx, avx2, fma, no avx512f)`.
impl fmt::Display for CpuInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.model, self.arch)?;
        for feature in &self.features {
            write!(f, ", {feature}")?;
        }
        for feature in &self.missing {
            write!(f, ", no {feature}")?;
        }
        write!(f, ")")
    }
}

/// The first `model name` of a `/proc/cpuinfo` text (every core repeats it).
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        (key.trim() == "model name" && !value.is_empty()).then_some(value)
    })
}

fn names(features: Vec<(&str, bool)>) -> Vec<String> {
    features.into_iter().map(|(name, _)| name.to_string()).collect()
}

/// Each of [`X86_FEATURES`] with whether this CPU has it.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn detected_x86_features() -> Vec<(&'static str, bool)> {
    use std::arch::is_x86_feature_detected as detected;
    let found = [detected!("sse4.2"), detected!("avx"), detected!("avx2"), detected!("fma"), detected!("avx512f")];
    X86_FEATURES.into_iter().zip(found).collect()
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
fn detected_x86_features() -> Vec<(&'static str, bool)> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_name_is_the_first_one_listed() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\n\
                       model name\t: AMD EPYC 7B13  64-Core Processor\nflags\t\t: fpu avx2\n\n\
                       processor\t: 1\nmodel name\t: Other\n";
        assert_eq!(model_name(cpuinfo).as_deref(), Some("AMD EPYC 7B13 64-Core Processor"));
        assert_eq!(model_name("processor : 0\nmodel name :   \n"), None);
        assert_eq!(model_name("CPU implementer : 0x41\n"), None);
    }

    #[test]
    fn display_lists_detected_then_missing_features() {
        let cpu = CpuInfo {
            model: "AMD EPYC 7B13".into(),
            arch: "x86_64".into(),
            features: vec!["avx2".into()],
            missing: vec!["avx512f".into()],
        };
        assert_eq!(cpu.to_string(), "AMD EPYC 7B13 (x86_64, avx2, no avx512f)");
        let bare = CpuInfo { model: UNKNOWN_MODEL.into(), arch: "aarch64".into(), features: vec![], missing: vec![] };
        assert_eq!(bare.to_string(), "unknown CPU (aarch64)");
    }

    #[test]
    fn detect_reports_every_x86_feature_once() {
        let cpu = CpuInfo::detect();
        assert_eq!(cpu.arch, std::env::consts::ARCH);
        assert!(!cpu.model.is_empty());
        let mut reported: Vec<&str> = cpu.features.iter().chain(&cpu.missing).map(String::as_str).collect();
        if cfg!(target_arch = "x86_64") {
            reported.sort_unstable();
            let mut expected = X86_FEATURES.to_vec();
            expected.sort_unstable();
            assert_eq!(reported, expected);
        } else {
            assert!(reported.is_empty());
        }
        let round_trip: CpuInfo =
            serde_json::from_value(serde_json::to_value(&cpu).expect("serializes")).expect("reads");
        assert_eq!(round_trip, cpu);
    }
}
