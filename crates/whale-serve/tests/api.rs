//! The HTTP API of `whale serve` as any client sees it: error replies, streaming, text
//! completions, the model list and model management.

mod common;

use common::{get, local, post, start, write_model};
use serde_json::{json, Value};
use whale_policy::{Policy, SamplingParams};
use whale_serve::ServeConfig;

fn chat_body(extra: Value) -> String {
    common::chat_body_with(json!({"temperature": 0, "max_tokens": 20, "seed": 1}), extra)
}

fn assert_error(reply: (u16, Value), status: u16, needle: &str) {
    let (got, body) = reply;
    assert_eq!(got, status, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("no OpenAI error: {body}"));
    assert!(body["error"]["type"].is_string(), "{body}");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

#[test]
fn malformed_requests_get_openai_errors_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 1);
    let server = start(dir.path(), ServeConfig { max_body_bytes: 4096, ..ServeConfig::default() });
    let chat = "/v1/chat/completions";
    assert_error(post(&server, chat, "{not json"), 400, "invalid request body");
    assert_error(post(&server, chat, &chat_body(json!({"temperature": "hot"}))), 400, "invalid type");
    assert_error(post(&server, chat, &chat_body(json!({"messages": "hi"}))), 400, "invalid");
    assert_error(post(&server, chat, &chat_body(json!({"functions": []}))), 400, "unknown field `functions`");
    let add = json!([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]);
    assert_error(post(&server, chat, &chat_body(json!({"tools": add}))), 400, "no tools part");
    let (_, body) = post(&server, chat, &chat_body(json!({"tools": add})));
    assert_eq!(body["error"]["param"], "tools");
    let (status, body) = post(&server, chat, &chat_body(json!({"tools": add, "tool_choice": "none"})));
    assert_eq!(status, 200, "`none` renders no tools, so any template serves it: {body}");
    assert_error(post(&server, chat, &chat_body(json!({"top_p": 2.0}))), 400, "top_p");
    assert_error(post(&server, chat, &chat_body(json!({"n": 1000}))), 400, "`n`");
    assert_error(post(&server, chat, &chat_body(json!({"model": "gpt-9"}))), 404, "gpt-9");
    let (_, body) = post(&server, chat, &chat_body(json!({"model": "gpt-9"})));
    assert_eq!(body["error"]["code"], "model_not_found");
    let long = "many words ".repeat(400);
    let too_long = chat_body(json!({"messages": [{"role": "user", "content": long}]}));
    assert_error(post(&server, chat, &too_long), 413, "4096 bytes");
    let long = "seven ".repeat(400);
    let (status, body) = post(&server, "/v1/completions", &json!({"model": "base", "prompt": long}).to_string());
    assert_eq!((status, &body["error"]["code"]), (400, &json!("context_length_exceeded")), "{body}");
    assert_error(
        post(&server, "/v1/completions", &json!({"model": "base", "prompt": [100000]}).to_string()),
        400,
        "vocabulary",
    );
    assert_error(get(&server, chat), 405, "POST");
    let refused = common::http().get(format!("http://{}{chat}", server.addr())).send().expect("GET");
    assert_eq!(refused.headers().get("allow").and_then(|v| v.to_str().ok()), Some("POST"));
    assert_error(post(&server, "/v1/embeddings", "{}"), 404, "no route");
    assert_error(post(&server, "/v1/load_lora_adapter", r#"{"lora_name": "x"}"#), 403, "--allow-runtime-loading");

    let (status, body) = post(&server, chat, &chat_body(json!({"logprobs": true})));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let token_ids = choice["token_ids"].as_array().expect("token ids");
    let logprobs = choice["logprobs"]["content"].as_array().expect("logprobs");
    assert_eq!(token_ids.len(), logprobs.len());
    assert!(logprobs
        .iter()
        .all(|entry| entry["logprob"].as_f64().is_some_and(|lp| lp <= 0.0) && entry["token"].is_string()));
    let usage = &body["usage"];
    assert_eq!(usage["completion_tokens"].as_u64(), Some(token_ids.len() as u64));
    assert_eq!(usage["total_tokens"], json!(usage["prompt_tokens"].as_u64().unwrap_or(0) + token_ids.len() as u64));
}

/// `(chunks as JSON, whether it ended with [DONE])` of a streamed reply.
fn read_stream(server: &whale_serve::Server, path: &str, body: String) -> (Vec<Value>, bool) {
    let response = common::http()
        .post(format!("http://{}{path}", server.addr()))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .expect("the server answers");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"].to_str().expect("ascii").to_string();
    assert_eq!(content_type, "text/event-stream");
    let text = response.text().expect("a body");
    let events: Vec<&str> = text.split("\n\n").filter(|event| !event.is_empty()).collect();
    let done = events.last() == Some(&"data: [DONE]");
    let chunks = events
        .iter()
        .filter(|event| **event != "data: [DONE]")
        .map(|event| serde_json::from_str(event.strip_prefix("data: ").expect("an SSE data line")).expect("JSON"))
        .collect();
    (chunks, done)
}

#[test]
fn a_streamed_reply_adds_up_to_the_whole_reply_and_ends_with_done() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 2);
    let server = start(dir.path(), ServeConfig::default());
    for extra in [json!({}), json!({"stop": ["ka", "lo", "e"], "temperature": 1.0, "n": 2}), json!({"logprobs": true})]
    {
        let (_, whole) = post(&server, "/v1/chat/completions", &chat_body(extra.clone()));
        let mut streamed = extra.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let (chunks, done) = read_stream(&server, "/v1/chat/completions", chat_body(streamed));
        assert!(done, "no [DONE] for {extra}");
        assert!(chunks.iter().all(|chunk| chunk["object"] == "chat.completion.chunk"));
        let choices = whole["choices"].as_array().expect("choices");
        for (index, choice) in choices.iter().enumerate() {
            let mine: Vec<&Value> = chunks
                .iter()
                .flat_map(|c| c["choices"].as_array().into_iter().flatten())
                .filter(|c| c["index"] == index)
                .collect();
            assert_eq!(mine[0]["delta"]["role"], "assistant");
            let text: String = mine.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
            let ids: Vec<Value> =
                mine.iter().flat_map(|c| c["token_ids"].as_array().cloned().unwrap_or_default()).collect();
            assert_eq!(text, choice["message"]["content"].as_str().expect("content"), "{extra}");
            assert_eq!(json!(ids), choice["token_ids"], "{extra}");
            assert_eq!(mine.last().map(|c| c["finish_reason"].clone()), Some(choice["finish_reason"].clone()));
            assert!(mine.len() > 2, "the reply came in {} chunks", mine.len());
            if extra.get("logprobs").is_some() {
                let streamed_logprobs =
                    mine.iter().filter_map(|c| c["logprobs"]["content"].as_array()).flatten().count();
                assert_eq!(streamed_logprobs, ids.len());
            }
        }
        let usage = chunks.last().expect("a usage chunk");
        assert_eq!(usage["usage"], whole["usage"], "{extra}");
    }
    let body = json!({"model": "base", "prompt": "Kalo has", "max_tokens": 12, "temperature": 0, "stream": true});
    let (chunks, done) = read_stream(&server, "/v1/completions", body.to_string());
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    let (_, whole) = post(
        &server,
        "/v1/completions",
        &json!({"model": "base", "prompt": "Kalo has", "max_tokens": 12, "temperature": 0}).to_string(),
    );
    assert!(done && chunks.iter().all(|chunk| chunk["object"] == "text_completion"));
    assert_eq!(text, whole["choices"][0]["text"].as_str().expect("text"));
}

#[test]
fn text_completions_continue_raw_text_as_the_engine_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 3);
    let server = start(dir.path(), ServeConfig::default());
    let body = json!({"model": "base", "prompt": "Kalo has 12", "max_tokens": 10, "temperature": 0.8, "seed": 4,
                      "top_k": 5, "logprobs": 0});
    let (status, reply) = post(&server, "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    let params = SamplingParams { max_tokens: 10, temperature: 0.8, seed: 4, top_k: 5, ..SamplingParams::default() };
    let expected = local(dir.path()).generate_text("Kalo has 12", &params).expect("in-process");
    let choice = &reply["choices"][0];
    assert_eq!(reply["object"], "text_completion");
    assert_eq!(choice["text"], json!(expected.text));
    assert_eq!(choice["token_ids"], json!(expected.token_ids));
    let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()
        .expect("logprobs")
        .iter()
        .map(|logprob| logprob.as_f64().expect("a number") as f32)
        .collect();
    assert_eq!(logprobs, expected.logprobs);
    assert_eq!(reply["usage"]["prompt_tokens"], json!(expected.prompt_tokens));
}

#[test]
fn models_are_listed_loaded_unloaded_and_reloaded() {
    let (base_dir, other_dir) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    write_model(base_dir.path(), 4);
    write_model(other_dir.path(), 5);
    let (adapter, broken) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let allowed = [base_dir.path(), other_dir.path(), adapter.path(), broken.path()];
    let server = start(base_dir.path(), common::loading_from(&allowed));
    let names = || -> Vec<String> {
        let (status, list) = get(&server, "/v1/models");
        assert_eq!((status, &list["object"]), (200, &json!("list")));
        list["data"].as_array().expect("data").iter().map(|m| m["id"].as_str().expect("id").to_string()).collect()
    };
    assert_eq!(names(), ["base"]);
    let load = |name: &str, dir: &std::path::Path| {
        post(&server, "/v1/load_lora_adapter", &json!({"lora_name": name, "lora_path": dir}).to_string())
    };
    assert_eq!(load("ckpt", other_dir.path()).0, 200);
    assert_eq!(names(), ["base", "ckpt"]);
    let (_, list) = get(&server, "/v1/models");
    assert_eq!((&list["data"][1]["parent"], &list["data"][0]["parent"]), (&json!("base"), &Value::Null));
    assert_error(load("ckpt", other_dir.path()), 400, "already loaded");
    assert_error(load("empty", &base_dir.path().join("nowhere")), 400, "neither");
    assert_error(post(&server, "/v1/load_lora_adapter", r#"{"lora_name": "x"}"#), 400, "lora_path");
    common::write_adapter(base_dir.path(), adapter.path(), 6);
    assert_eq!(load("lora", adapter.path()).0, 200);
    assert_eq!(names(), ["base", "ckpt", "lora"]);
    std::fs::write(broken.path().join("adapter_config.json"), "{}").expect("written");
    assert_error(load("broken", broken.path()), 400, "adapter_config.json");
    assert_eq!(post(&server, "/v1/unload_lora_adapter", r#"{"lora_name": "lora"}"#).0, 200);
    assert_error(post(&server, "/v1/unload_lora_adapter", r#"{"lora_name": "base"}"#), 400, "base model");
    assert_error(post(&server, "/v1/unload_lora_adapter", r#"{"lora_name": "nope"}"#), 404, "nope");
    assert_eq!(post(&server, "/unload_lora_adapter", r#"{"lora_name": "ckpt"}"#).0, 200);
    assert_eq!(names(), ["base"]);

    let ask = json!({"model": "base", "messages": [{"role": "user", "content": "Mira has 5 keys."}],
                     "temperature": 0, "max_tokens": 12})
    .to_string();
    let other = local(other_dir.path());
    let expected = other.chat(common::request("Mira has 5 keys.", 0.0, 0, 12)).expect("in-process");
    assert_ne!(post(&server, "/v1/chat/completions", &ask).1["choices"][0]["token_ids"], json!(expected.token_ids));
    let reload = json!({"model_path": other_dir.path()}).to_string();
    let (status, reply) = post(&server, "/update_weights_from_disk", &reload);
    assert_eq!((status, &reply["weights_version"]), (200, &json!(1)), "{reply}");
    assert_eq!(post(&server, "/v1/chat/completions", &ask).1["choices"][0]["token_ids"], json!(expected.token_ids));
}
