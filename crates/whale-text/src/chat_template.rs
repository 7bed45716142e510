//! Chat messages -> the prompt string a model was trained on, by the model's own Jinja chat
//! template from `tokenizer_config.json`, rendered the way Hugging Face `transformers` does
//! (trim/lstrip blocks, Python string methods, `raise_exception`, Python-style `tojson`), so a real
//! Qwen3 checkpoint sees exactly the prompts it was tuned on. The tiny model ships ChatML.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::json;
use whale_core::ChatMessage;

use crate::tokenizer::{SpecialTokens, ENDOFTEXT, IM_END, IM_START};

/// ChatML: every turn is `<|im_start|>{role}\n{content}<|im_end|>\n`; the generation prompt is
/// `<|im_start|>assistant\n`.
pub const CHATML_TEMPLATE: &str = r#"{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// File name of the Hugging Face tokenizer configuration.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// The stand-alone chat template that transformers (4.43 and later) saves beside the config.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Name under which a list-form `chat_template` keeps the template used for plain chat.
const DEFAULT_TEMPLATE_NAME: &str = "default";

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("{}: cannot read: {reason}", file.display())]
    Read { file: PathBuf, reason: String },
    #[error("{}: not valid JSON: {reason}", file.display())]
    Json { file: PathBuf, reason: String },
    #[error("{}: {reason}", file.display())]
    Config { file: PathBuf, reason: String },
    #[error("{}: cannot write: {reason}", file.display())]
    Write { file: PathBuf, reason: String },
    #[error("chat template {template}{}: syntax error: {reason}", at_line(*line))]
    Syntax { template: String, line: Option<usize>, reason: String },
    #[error("chat template {template}{}: {reason}", at_line(*line))]
    Render { template: String, line: Option<usize>, reason: String },
    /// The template's own `raise_exception` refused the messages (a system message after the
    /// first, roles that do not alternate): what the request asked for, not how it was rendered.
    #[error("chat template {template}{} refused the messages: {message}", at_line(*line))]
    Refused { template: String, line: Option<usize>, message: String },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|n| format!(" line {n}")).unwrap_or_default()
}

/// Per-call template variables besides the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// Append the opening of an assistant turn for the model to complete.
    pub add_generation_prompt: bool,
    /// Qwen3's thinking switch; left undefined in the template when `None`.
    pub enable_thinking: Option<bool>,
    /// Tool schemas (OpenAI function format); left undefined in the template when `None`.
    pub tools: Option<Vec<serde_json::Value>>,
}

/// A compiled chat template plus the special-token strings it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    name: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`; `name` identifies it in error messages.
    pub fn new(name: &str, source: &str) -> Result<Self, ChatTemplateError> {
        let mut env = hugging_face_environment();
        env.add_template_owned(name.to_string(), source.to_string()).map_err(|e| failure(name, &e, true))?;
        Ok(Self { env, name: name.to_string(), bos_token: None, eos_token: None })
    }

    /// The ChatML template of the tiny model, with `<|im_end|>` as `eos_token`.
    pub fn chatml() -> Self {
        Self::new("chatml", CHATML_TEMPLATE)
            .expect("CHATML_TEMPLATE is a constant that compiles")
            .with_special_tokens(None, Some(IM_END.to_string()))
    }

    /// Sets the strings bound to `bos_token` / `eos_token` (undefined when `None`).
    pub fn with_special_tokens(mut self, bos: Option<String>, eos: Option<String>) -> Self {
        self.bos_token = bos;
        self.eos_token = eos;
        self
    }

    /// Reads `chat_template` (a string, or a list of `{name, template}` of which "default" is
    /// taken), `bos_token` and `eos_token` from a `tokenizer_config.json`.
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Self, ChatTemplateError> {
        let file = path.as_ref();
        let config = read_json(file)?;
        let config_error = |reason: String| ChatTemplateError::Config { file: file.to_path_buf(), reason };
        let (label, source) = template_source(&config).map_err(config_error)?;
        let name = format!("{}#{label}", file.display());
        Self::new(&name, source)?.with_config_tokens(&config, file)
    }

    /// The chat template of a Hugging Face model directory: `chat_template.jinja` when present
    /// (transformers prefers it, and recent versions save the template only there), otherwise
    /// `chat_template` in `tokenizer_config.json`, which gives `bos_token` and `eos_token` either way.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ChatTemplateError> {
        let config_file = dir.join(TOKENIZER_CONFIG_FILE);
        let jinja = dir.join(CHAT_TEMPLATE_FILE);
        if !jinja.is_file() {
            return Self::from_tokenizer_config(&config_file);
        }
        let source = std::fs::read_to_string(&jinja)
            .map_err(|e| ChatTemplateError::Read { file: jinja.clone(), reason: e.to_string() })?;
        Self::new(&jinja.display().to_string(), &source)?.with_config_tokens(&read_json(&config_file)?, &config_file)
    }

    fn with_config_tokens(self, config: &serde_json::Value, file: &Path) -> Result<Self, ChatTemplateError> {
        let config_error = |reason: String| ChatTemplateError::Config { file: file.to_path_buf(), reason };
        let bos = token_string(config, "bos_token").map_err(config_error)?;
        let eos = token_string(config, "eos_token").map_err(config_error)?;
        Ok(self.with_special_tokens(bos, eos))
    }

    /// The name errors are reported under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renders `messages` (each a `{role, content}` mapping) into the prompt text.
    pub fn render(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String, ChatTemplateError> {
        let mut context: BTreeMap<&str, Value> = BTreeMap::new();
        context.insert("messages", Value::from_serialize(messages));
        context.insert("add_generation_prompt", Value::from(options.add_generation_prompt));
        let optional = [
            ("bos_token", self.bos_token.as_ref().map(Value::from)),
            ("eos_token", self.eos_token.as_ref().map(Value::from)),
            ("enable_thinking", options.enable_thinking.map(Value::from)),
            ("tools", options.tools.as_ref().map(Value::from_serialize)),
        ];
        context.extend(optional.into_iter().filter_map(|(key, value)| Some((key, value?))));
        let template = self.env.get_template(&self.name).map_err(|e| failure(&self.name, &e, false))?;
        template.render(context).map_err(|e| failure(&self.name, &e, false))
    }
}

fn read_json(file: &Path) -> Result<serde_json::Value, ChatTemplateError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ChatTemplateError::Read { file: file.to_path_buf(), reason: e.to_string() })?;
    serde_json::from_str(&text).map_err(|e| ChatTemplateError::Json { file: file.to_path_buf(), reason: e.to_string() })
}

/// Writes `dir/tokenizer_config.json` for a ChatML tokenizer with `chat_template` (checked to
/// compile first) so `transformers.AutoTokenizer` and inference servers load it as is.
pub fn write_tokenizer_config(
    dir: impl AsRef<Path>,
    chat_template: &str,
    specials: &SpecialTokens,
    model_max_length: usize,
) -> Result<PathBuf, ChatTemplateError> {
    let file = dir.as_ref().join(TOKENIZER_CONFIG_FILE);
    ChatTemplate::new(&format!("{}#chat_template", file.display()), chat_template)?;
    let added = |token: &str| {
        json!({
            "content": token, "lstrip": false, "normalized": false,
            "rstrip": false, "single_word": false, "special": true
        })
    };
    let config = json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": {
            specials.endoftext.to_string(): added(ENDOFTEXT),
            specials.im_start.to_string(): added(IM_START),
            specials.im_end.to_string(): added(IM_END),
        },
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": null,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": false,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": null,
    });
    let write_error = |reason: String| ChatTemplateError::Write { file: file.clone(), reason };
    let text = serde_json::to_string_pretty(&config).map_err(|e| write_error(e.to_string()))?;
    std::fs::write(&file, text + "\n").map_err(|e| write_error(e.to_string()))?;
    Ok(file)
}

/// The Jinja dialect of `transformers.apply_chat_template`.
fn hugging_face_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", python_tojson);
    env
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// What marks an error as the template's own `raise_exception` (its message, as the template
/// gave it), so that [`failure`] tells a refusal apart from a failed render.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

/// `json.dumps(value, ensure_ascii=False, indent=indent)` as `transformers` defines `tojson`:
/// `", "` and `": "` separators, non-ASCII kept, no HTML escaping.
fn python_tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let serialized = match indent {
        Some(width) => {
            let spaces = vec![b' '; width];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&spaces);
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonCompact)),
    };
    serialized.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

/// Python's default single-line JSON layout.
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

fn failure(template: &str, error: &Error, at_compile: bool) -> ChatTemplateError {
    let reason = match error.detail() {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    };
    let template = template.to_string();
    let line = error.line();
    let raised = std::error::Error::source(error).and_then(|source| source.downcast_ref::<Raised>());
    if let Some(Raised(message)) = raised {
        return ChatTemplateError::Refused { template, line, message: message.clone() };
    }
    if at_compile {
        ChatTemplateError::Syntax { template, line, reason }
    } else {
        ChatTemplateError::Render { template, line, reason }
    }
}

/// The template text and a label for it ("chat_template" or the list entry's name).
fn template_source(config: &serde_json::Value) -> Result<(String, &str), String> {
    match config.get("chat_template") {
        Some(serde_json::Value::String(source)) => Ok(("chat_template".to_string(), source)),
        Some(serde_json::Value::Array(entries)) => {
            let mut names = Vec::new();
            for entry in entries {
                let (name, source) = named_template(entry)
                    .ok_or("chat_template list entries must be {\"name\": str, \"template\": str}")?;
                if name == DEFAULT_TEMPLATE_NAME {
                    return Ok((format!("chat_template[{name}]"), source));
                }
                names.push(name);
            }
            Err(format!("chat_template list has no \"{DEFAULT_TEMPLATE_NAME}\" entry (has {names:?})"))
        }
        Some(other) => Err(format!("chat_template must be a string or a list, not {other}")),
        None => Err("no chat_template key".to_string()),
    }
}

fn named_template(entry: &serde_json::Value) -> Option<(&str, &str)> {
    Some((entry.get("name")?.as_str()?, entry.get("template")?.as_str()?))
}

/// A special token given as a string, as `{"content": ...}`, or null/absent.
fn token_string(config: &serde_json::Value, key: &str) -> Result<Option<String>, String> {
    match config.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(token)) => Ok(Some(token.clone())),
        Some(serde_json::Value::Object(fields)) => match fields.get("content") {
            Some(serde_json::Value::String(token)) => Ok(Some(token.clone())),
            _ => Err(format!("{key} object has no string \"content\"")),
        },
        Some(other) => Err(format!("{key} must be a string or an object, not {other}")),
    }
}
