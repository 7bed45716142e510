//! Llama's scaled rotary embeddings: a config's `rope_scaling` read, and the inverse frequencies
//! it gives, as `transformers` computes them (`modeling_rope_utils`).
//!
//! Why: Llama checkpoints stretch their context by scaling the rotary frequencies instead of
//! retraining, and decoding one without its scaling gives other numbers than the model was
//! trained with. Only the kinds whale computes are read; any other is refused, so a checkpoint
//! is never run with frequencies it was not trained with.

use crate::qwen3::config::{optional, ConfigIssue};
use serde::Serialize;
use serde_json::{Map, Value};

/// How a config scales the rotary inverse frequencies; written back under `rope_type`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (positions interpolated).
    Linear { factor: f64 },
    /// Llama 3.1's: wavelengths longer than `original_max_position_embeddings / low_freq_factor`
    /// are divided by `factor`, those shorter than `original_max_position_embeddings /
    /// high_freq_factor` kept, and those between interpolated smoothly.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

impl RopeScaling {
    /// The scaling of `config.json`'s table under `key` (`rope_scaling`, or `rope_parameters` as
    /// `transformers` 5 writes it), by its `rope_type` (or the older `type`); `None` when the
    /// table is null or absent, or its type `default`. An issue names the key at fault, e.g.
    /// `rope_scaling.rope_type` for a type whale does not compute.
    pub fn read(object: &Map<String, Value>, key: &str) -> Result<Option<Self>, ConfigIssue> {
        let table = match object.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(table)) => table,
            Some(other) => return Err(ConfigIssue::new(key, format!("expected an object or null, found {other}"))),
        };
        let type_key = if table.contains_key("rope_type") { "rope_type" } else { "type" };
        let field = |name: &str| format!("{key}.{name}");
        let kind: Option<String> =
            optional(table, type_key).map_err(|issue| ConfigIssue::new(&field(type_key), issue.reason))?;
        let number = |name: &str| -> Result<f64, ConfigIssue> {
            let value: Option<f64> =
                optional(table, name).map_err(|issue| ConfigIssue::new(&field(name), issue.reason))?;
            match value {
                Some(value) if value.is_finite() && value > 0.0 => Ok(value),
                Some(value) => Err(ConfigIssue::new(&field(name), format!("{value} is not a positive number"))),
                None => Err(ConfigIssue::new(&field(name), "missing")),
            }
        };
        match kind.as_deref() {
            None if key == "rope_parameters" => Ok(None),
            None => Err(ConfigIssue::new(&field("rope_type"), "missing")),
            Some("default") => Ok(None),
            Some("linear") => Ok(Some(Self::Linear { factor: number("factor")? })),
            Some("llama3") => {
                let (low_freq_factor, high_freq_factor) = (number("low_freq_factor")?, number("high_freq_factor")?);
                if high_freq_factor <= low_freq_factor {
                    return Err(ConfigIssue::new(
                        &field("high_freq_factor"),
                        format!("{high_freq_factor} is not above low_freq_factor {low_freq_factor}"),
                    ));
                }
                let original = number("original_max_position_embeddings")?;
                if original.fract() != 0.0 {
                    return Err(ConfigIssue::new(
                        &field("original_max_position_embeddings"),
                        format!("{original} is not a whole number"),
                    ));
                }
                Ok(Some(Self::Llama3 {
                    factor: number("factor")?,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: original as usize,
                }))
            }
            Some(other) => Err(ConfigIssue::new(
                &field(type_key),
                format!("{other:?} is not supported (only \"linear\" and \"llama3\")"),
            )),
        }
    }

    /// The scaled frequencies of the unscaled `inverse_frequencies`.
    pub fn scale(&self, inverse_frequencies: &[f64]) -> Vec<f64> {
        match *self {
            Self::Linear { factor } => inverse_frequencies.iter().map(|frequency| frequency / factor).collect(),
            Self::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let original = original_max_position_embeddings as f64;
                let (long, short) = (original / low_freq_factor, original / high_freq_factor);
                let scaled = |frequency: f64| {
                    let wavelength = 2.0 * std::f64::consts::PI / frequency;
                    if wavelength < short {
                        frequency
                    } else if wavelength > long {
                        frequency / factor
                    } else {
                        let smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * frequency / factor + smooth * frequency
                    }
                };
                inverse_frequencies.iter().map(|&frequency| scaled(frequency)).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(table: Value) -> Result<Option<RopeScaling>, ConfigIssue> {
        let object = json!({ "rope_scaling": table });
        RopeScaling::read(object.as_object().unwrap(), "rope_scaling")
    }

    /// `1 / 10000^(2i / 8)`, a head of 8: 1, 0.1, 0.01 and 0.001.
    const PLAIN: [f64; 4] = [1.0, 0.1, 0.01, 0.001];

    fn assert_close(ours: &[f64], expected: &[f64]) {
        assert_eq!(ours.len(), expected.len());
        for (index, (ours, expected)) in ours.iter().zip(expected).enumerate() {
            assert!((ours - expected).abs() <= 1e-12 * expected.abs(), "frequency {index}: {ours} vs {expected}");
        }
    }

    #[test]
    fn linear_scaling_divides_every_frequency_by_the_factor() {
        let scaling = read(json!({"rope_type": "linear", "factor": 4.0})).unwrap().unwrap();
        assert_close(&scaling.scale(&PLAIN), &[0.25, 0.025, 0.0025, 0.00025]);
    }

    /// Wavelengths 2π / f: 6.3 and 63 lie below 1000 / 4 (kept), 628 between 1000 / 4 and
    /// 1000 / 1 (interpolated), 6283 above 1000 (divided by the factor 8).
    #[test]
    fn llama3_scaling_keeps_short_wavelengths_divides_long_ones_and_blends_between() {
        let table = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 1000});
        let scaling = read(table).unwrap().unwrap();
        let smooth = (1000.0 * 0.01 / (2.0 * std::f64::consts::PI) - 1.0) / (4.0 - 1.0);
        let blended = (1.0 - smooth) * 0.01 / 8.0 + smooth * 0.01;
        assert!((blended - 0.002_975_352_5).abs() < 1e-11, "{blended}");
        assert_close(&scaling.scale(&PLAIN), &[1.0, 0.1, blended, 0.001 / 8.0]);
    }

    #[test]
    fn the_older_type_key_and_null_and_default_read() {
        let legacy = read(json!({"type": "linear", "factor": 2.0})).unwrap();
        assert_eq!(legacy, Some(RopeScaling::Linear { factor: 2.0 }));
        assert_eq!(read(Value::Null).unwrap(), None);
        assert_eq!(read(json!({"rope_type": "default"})).unwrap(), None);
        let object = json!({"rope_parameters": {"rope_theta": 10000.0}});
        assert_eq!(RopeScaling::read(object.as_object().unwrap(), "rope_parameters").unwrap(), None);
    }

    #[test]
    fn an_unknown_type_or_a_bad_factor_is_refused_naming_the_field() {
        let issue = read(json!({"rope_type": "yarn", "factor": 4.0})).unwrap_err();
        assert_eq!(issue.key, "rope_scaling.rope_type");
        assert!(issue.reason.contains("\"yarn\""), "{issue}");
        let issue = read(json!({"type": "dynamic", "factor": 4.0})).unwrap_err();
        assert_eq!((issue.key.as_str(), issue.reason.contains("\"dynamic\"")), ("rope_scaling.type", true));
        assert_eq!(read(json!({"rope_type": "linear"})).unwrap_err().key, "rope_scaling.factor");
        assert_eq!(read(json!({"rope_type": "linear", "factor": -1.0})).unwrap_err().key, "rope_scaling.factor");
        let inverted = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                              "original_max_position_embeddings": 8192});
        assert_eq!(read(inverted).unwrap_err().key, "rope_scaling.high_freq_factor");
        assert_eq!(read(json!({"factor": 2.0})).unwrap_err().key, "rope_scaling.rope_type");
        assert_eq!(read(json!("linear")).unwrap_err().key, "rope_scaling");
    }
}
