use serde_json::json;
use whale_core::ChatMessage;
use whale_text::{
    write_tokenizer_config, ChatTemplate, ChatTemplateError, RenderOptions, SpecialTokens, CHATML_TEMPLATE,
    CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE,
};

/// `chat_template` of the public Qwen3 `tokenizer_config.json` (Qwen/Qwen3-* releases).
const QWEN3_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn generation_prompt() -> RenderOptions {
    RenderOptions { add_generation_prompt: true, ..RenderOptions::default() }
}

fn qwen3() -> ChatTemplate {
    ChatTemplate::new("qwen3", QWEN3_TEMPLATE).expect("Qwen3 template compiles")
}

fn system_and_user() -> Vec<ChatMessage> {
    vec![msg("system", "You are a careful solver."), msg("user", "What is 6*7?")]
}

#[test]
fn chatml_renders_each_turn_and_the_generation_prompt() {
    let messages =
        vec![msg("system", "Be brief."), msg("user", "2+2?"), msg("assistant", "4"), msg("user", "and 3+3?")];
    let turns = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
                 <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n";
    let chatml = ChatTemplate::chatml();
    assert_eq!(chatml.render(&messages, &RenderOptions::default()).expect("render"), turns);
    assert_eq!(
        chatml.render(&messages, &generation_prompt()).expect("render"),
        format!("{turns}<|im_start|>assistant\n")
    );
}

#[test]
fn qwen3_template_renders_a_system_and_user_prompt() {
    let rendered = qwen3().render(&system_and_user(), &generation_prompt()).expect("render");
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a careful solver.<|im_end|>\n\
         <|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_thinking = RenderOptions { enable_thinking: Some(false), ..generation_prompt() };
    assert_eq!(
        qwen3().render(&system_and_user(), &no_thinking).expect("render"),
        format!("{rendered}<think>\n\n</think>\n\n")
    );
    let thinking = RenderOptions { enable_thinking: Some(true), ..generation_prompt() };
    assert_eq!(qwen3().render(&system_and_user(), &thinking).expect("render"), rendered);
}

#[test]
fn qwen3_template_drops_reasoning_before_the_last_query_and_keeps_it_after() {
    let messages = vec![
        msg("user", "2+2?"),
        msg("assistant", "<think>\nadd them\n</think>\n\n4"),
        msg("user", "times 3?"),
        msg("assistant", "<think>\n4*3\n</think>\n\n12"),
    ];
    assert_eq!(
        qwen3().render(&messages, &RenderOptions::default()).expect("render"),
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
         <|im_start|>user\ntimes 3?<|im_end|>\n\
         <|im_start|>assistant\n<think>\n4*3\n</think>\n\n12<|im_end|>\n"
    );
}

#[test]
fn qwen3_template_lists_tools_as_python_json_and_wraps_tool_results() {
    let calculator = json!({
        "function": {
            "description": "Evaluates an arithmetic expression like 6*7 < 50.",
            "name": "calculator",
            "parameters": {
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
                "type": "object"
            }
        },
        "type": "function"
    });
    let mut messages = system_and_user();
    messages.extend([msg("assistant", "I will compute."), msg("tool", "42")]);
    let options = RenderOptions { tools: Some(vec![calculator]), ..generation_prompt() };
    let expected = concat!(
        "<|im_start|>system\nYou are a careful solver.\n\n# Tools\n\n",
        "You may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        r#"{"function": {"description": "Evaluates an arithmetic expression like 6*7 < 50.", "name": "calculator", "#,
        r#""parameters": {"properties": {"expression": {"type": "string"}}, "required": ["expression"], "type": "object"}}, "#,
        r#""type": "function"}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments ",
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n",
        r#"{"name": <function-name>, "arguments": <args-json-object>}"#,
        "\n</tool_call><|im_end|>\n",
        "<|im_start|>user\nWhat is 6*7?<|im_end|>\n",
        "<|im_start|>assistant\nI will compute.<|im_end|>\n",
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(qwen3().render(&messages, &options).expect("render"), expected);
}

#[test]
fn tojson_matches_python_json_dumps() {
    let template =
        ChatTemplate::new("json", "{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}").expect("compiles");
    let options =
        RenderOptions { tools: Some(vec![json!({"a": [1, 2.5], "b": "é<>&\"\n", "c": {}})]), ..Default::default() };
    assert_eq!(
        template.render(&[], &options).expect("render"),
        "{\"a\": [1, 2.5], \"b\": \"é<>&\\\"\\n\", \"c\": {}}|\
         {\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": \"é<>&\\\"\\n\",\n  \"c\": {}\n}"
    );
}

#[test]
fn raise_exception_is_a_refusal_with_template_name_line_and_message() {
    let source = "{%- for message in messages %}\n\
                  {%- if message.role not in ['user', 'assistant'] %}\n\
                  {{- raise_exception('Only user and assistant roles are supported!') }}\n\
                  {%- endif %}\n\
                  {{- message.content }}\n\
                  {%- endfor %}";
    let strict = ChatTemplate::new("strict", source).expect("compiles");
    assert_eq!(strict.render(&[msg("user", "hi")], &RenderOptions::default()).expect("render"), "hi");
    let err = strict.render(&system_and_user(), &RenderOptions::default()).expect_err("system role");
    let ChatTemplateError::Refused { line: Some(3), message, .. } = &err else { panic!("{err:?}") };
    assert_eq!(message, "Only user and assistant roles are supported!");
    let shown = err.to_string();
    assert!(shown.starts_with("chat template strict line 3 refused the messages: Only user"), "{shown}");
}

/// A render that fails for another reason (here an unknown filter) is not a refusal: it may be
/// whale's rendering at fault, not the messages.
#[test]
fn a_failed_render_is_not_a_refusal() {
    let broken = ChatTemplate::new("odd", "{{ messages[0].content | no_such_filter }}");
    let err = match broken {
        Ok(template) => template.render(&[msg("user", "hi")], &RenderOptions::default()).expect_err("unknown filter"),
        Err(err) => err,
    };
    assert!(!matches!(err, ChatTemplateError::Refused { .. }), "{err:?}");
    let undefined = ChatTemplate::new("undefined", "{{ messages[0].content.no_such_method() }}").expect("compiles");
    let err = undefined.render(&[msg("user", "hi")], &RenderOptions::default()).expect_err("unknown method");
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err:?}");
}

#[test]
fn syntax_errors_name_the_template_and_line() {
    let err = ChatTemplate::new("broken", "{{ bos_token }}\n{% for m in messages %}\n{{ m.content | }}\n{% endfor %}")
        .expect_err("syntax error");
    assert!(matches!(&err, ChatTemplateError::Syntax { line: Some(3), .. }), "{err:?}");
    assert!(err.to_string().starts_with("chat template broken line 3: syntax error"), "{err}");
}

#[test]
fn written_tokenizer_config_is_hugging_face_shaped_and_loads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let specials = SpecialTokens { endoftext: 151643, im_start: 151644, im_end: 151645 };
    let file = write_tokenizer_config(dir.path(), CHATML_TEMPLATE, &specials, 2048).expect("write");
    assert_eq!(file, dir.path().join(TOKENIZER_CONFIG_FILE));

    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
    assert_eq!(config["chat_template"], CHATML_TEMPLATE);
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(config["pad_token"], "<|endoftext|>");
    assert_eq!(config["model_max_length"], 2048);
    let decoder = &config["added_tokens_decoder"];
    for (id, token) in [("151643", "<|endoftext|>"), ("151644", "<|im_start|>"), ("151645", "<|im_end|>")] {
        assert_eq!(decoder[id]["content"], token);
        assert_eq!(decoder[id]["special"], true);
        assert_eq!(decoder[id]["normalized"], false);
    }

    let loaded = ChatTemplate::from_tokenizer_config(&file).expect("load");
    let messages = system_and_user();
    assert_eq!(
        loaded.render(&messages, &generation_prompt()).expect("render"),
        ChatTemplate::chatml().render(&messages, &generation_prompt()).expect("render")
    );
}

#[test]
fn writing_a_broken_template_fails_before_any_file_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let specials = SpecialTokens { endoftext: 0, im_start: 1, im_end: 2 };
    let err = write_tokenizer_config(dir.path(), "{% if add_generation_prompt %}", &specials, 512)
        .expect_err("unclosed block");
    assert!(matches!(err, ChatTemplateError::Syntax { .. }), "{err:?}");
    assert!(!dir.path().join(TOKENIZER_CONFIG_FILE).exists());
}

#[test]
fn config_with_named_templates_uses_default_and_binds_special_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(TOKENIZER_CONFIG_FILE);
    let config = json!({
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}
        ],
        "bos_token": {"content": "<s>", "special": true},
        "eos_token": "</s>"
    });
    std::fs::write(&file, config.to_string()).expect("write");
    let template = ChatTemplate::from_tokenizer_config(&file).expect("load");
    assert!(template.name().ends_with("#chat_template[default]"), "{}", template.name());
    assert_eq!(
        template.render(&system_and_user(), &RenderOptions::default()).expect("render"),
        "<s>[system]You are a careful solver.</s>[user]What is 6*7?</s>"
    );

    std::fs::write(&file, json!({"chat_template": [{"name": "tool_use", "template": "T"}]}).to_string())
        .expect("write");
    let err = ChatTemplate::from_tokenizer_config(&file).expect_err("no default");
    assert!(matches!(err, ChatTemplateError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("tool_use") && err.to_string().contains(TOKENIZER_CONFIG_FILE), "{err}");
}

#[test]
fn config_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent").join(TOKENIZER_CONFIG_FILE);
    let err = ChatTemplate::from_tokenizer_config(&missing).expect_err("missing");
    assert!(matches!(err, ChatTemplateError::Read { .. }));
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"chat_template\": ").expect("write");
    let err = ChatTemplate::from_tokenizer_config(&bad).expect_err("bad json");
    assert!(matches!(err, ChatTemplateError::Json { .. }) && err.to_string().contains("bad.json"), "{err}");

    let no_template = dir.path().join("plain.json");
    std::fs::write(&no_template, "{\"eos_token\": \"</s>\"}").expect("write");
    let err = ChatTemplate::from_tokenizer_config(&no_template).expect_err("no template");
    assert!(matches!(err, ChatTemplateError::Config { .. }) && err.to_string().contains("plain.json"), "{err}");
}

#[test]
fn a_model_directory_prefers_chat_template_jinja_and_takes_its_tokens_from_the_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}});
    std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), config.to_string()).expect("write");
    let no_template = ChatTemplate::from_model_dir(dir.path()).expect_err("no template anywhere");
    assert!(no_template.to_string().contains(TOKENIZER_CONFIG_FILE), "{no_template}");

    let jinja = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}";
    std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), jinja).expect("write");
    let template = ChatTemplate::from_model_dir(dir.path()).expect("load");
    assert!(template.name().ends_with(CHAT_TEMPLATE_FILE), "{}", template.name());
    assert_eq!(
        template.render(&system_and_user(), &RenderOptions::default()).expect("render"),
        "<s><system>You are a careful solver.</s><user>What is 6*7?</s>"
    );

    std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), "{% for m in messages %}").expect("write");
    let broken = ChatTemplate::from_model_dir(dir.path()).expect_err("unclosed block");
    assert!(matches!(broken, ChatTemplateError::Syntax { .. }) && broken.to_string().contains(CHAT_TEMPLATE_FILE));
}
