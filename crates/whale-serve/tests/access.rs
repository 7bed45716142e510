//! Who may use the server, over real HTTP: the API key on every route (missing, wrong, off by
//! its last byte), whale's own client sending it, the admin endpoints off by default, the
//! allowed directories with `..` and symlink escapes, and the refusal to serve a non-loopback
//! address without a key.

mod common;

use std::path::Path;

use common::{loading_from, local, request, write_adapter, write_model};
use serde_json::{json, Value};
use whale_policy::{Policy, PolicyError, RemoteConfig, RemoteError, RemotePolicy};
use whale_serve::{ApiKey, LoadSettings, ModelRegistry, RuntimeLoading, ServeConfig, ServeError, Server};

const KEY: &str = "sk-whale-0123456789";

/// What a reply was: its status, JSON body and `WWW-Authenticate` header.
struct Answer {
    status: u16,
    body: Value,
    www_authenticate: Option<String>,
}

/// Sends `method path` with `body` (POST) and, when given, `Authorization: <authorization>`.
fn send(server: &Server, method: &str, path: &str, body: &str, authorization: Option<&str>) -> Answer {
    let url = format!("http://{}{path}", server.addr());
    let client = common::http();
    let mut builder = match method {
        "GET" => client.get(url),
        _ => client.post(url).header("Content-Type", "application/json").body(body.to_string()),
    };
    if let Some(value) = authorization {
        builder = builder.header("Authorization", value);
    }
    let response = builder.send().expect("the server answers");
    let status = response.status().as_u16();
    let www_authenticate =
        response.headers().get("www-authenticate").and_then(|value| value.to_str().ok()).map(str::to_string);
    let text = response.text().expect("a body");
    Answer { status, body: serde_json::from_str(&text).unwrap_or(Value::String(text)), www_authenticate }
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn served_names(server: &Server) -> Vec<String> {
    server.registry().list().into_iter().map(|info| info.name).collect()
}

fn chat(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "Tova has 3 cups."}], "max_tokens": 4,
           "temperature": 0})
    .to_string()
}

/// Every route with a body that succeeds on a server serving `model_dir` as `base` with
/// runtime loading from it; loads and unloads come in pairs, so the list can run twice.
fn every_route(model_dir: &Path) -> Vec<(&'static str, &'static str, String)> {
    let load = |name: &str| json!({"lora_name": name, "lora_path": model_dir}).to_string();
    let unload = |name: &str| json!({"lora_name": name}).to_string();
    vec![
        ("GET", "/health", String::new()),
        ("GET", "/v1/models", String::new()),
        ("POST", "/v1/chat/completions", chat("base")),
        ("POST", "/v1/completions", json!({"model": "base", "prompt": "Tova has", "max_tokens": 4}).to_string()),
        ("POST", "/v1/load_lora_adapter", load("copy")),
        ("POST", "/v1/unload_lora_adapter", unload("copy")),
        ("POST", "/load_lora_adapter", load("copy-2")),
        ("POST", "/unload_lora_adapter", unload("copy-2")),
        ("POST", "/update_weights_from_disk", json!({"model_path": model_dir}).to_string()),
    ]
}

#[test]
fn with_a_key_every_route_answers_only_requests_that_carry_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 1);
    let api_key = Some(ApiKey::new(KEY).expect("a valid key"));
    let server = common::start(dir.path(), ServeConfig { api_key, ..loading_from(&[dir.path()]) });
    let last_byte_differs = format!("{}8", &KEY[..KEY.len() - 1]);
    let refused = [
        None,
        Some(bearer("not-the-key")),
        Some(bearer(&last_byte_differs)),
        Some(bearer(&KEY[..KEY.len() - 1])),
        Some(bearer(&format!("{KEY}0"))),
        Some(format!("Basic {KEY}")),
        Some(KEY.to_string()),
    ];
    let mut routes = every_route(dir.path());
    routes.push(("POST", "/v1/embeddings", "{}".to_string()));
    for (method, path, body) in &routes {
        for authorization in &refused {
            let answer = send(&server, method, path, body, authorization.as_deref());
            let seen = format!("{method} {path} with {authorization:?}: {}", answer.body);
            assert_eq!(answer.status, 401, "{seen}");
            assert_eq!(answer.body["error"]["type"], "invalid_request_error", "{seen}");
            assert_eq!(answer.body["error"]["code"], "invalid_api_key", "{seen}");
            assert_eq!(answer.www_authenticate.as_deref(), Some("Bearer"), "{seen}");
        }
    }
    assert_eq!(served_names(&server), ["base"], "no refused request changed what is served");
    let missing = send(&server, "GET", "/v1/models", "", None);
    assert!(missing.body["error"]["message"].as_str().is_some_and(|m| m.contains("Authorization: Bearer")));
    let wrong = send(&server, "GET", "/v1/models", "", Some(&bearer(&last_byte_differs)));
    assert_eq!(wrong.body["error"]["message"], "incorrect API key", "the key is not echoed");

    for (method, path, body) in &routes[..routes.len() - 1] {
        let answer = send(&server, method, path, body, Some(&bearer(KEY)));
        assert_eq!(answer.status, 200, "{method} {path}: {}", answer.body);
    }
    let lower_case_scheme = send(&server, "GET", "/v1/models", "", Some(&format!("bearer {KEY}")));
    assert_eq!(lower_case_scheme.status, 200);
    assert_eq!(send(&server, "POST", "/v1/embeddings", "{}", Some(&bearer(KEY))).status, 404);
}

#[test]
fn whale_s_client_sends_the_key_and_a_wrong_one_is_not_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 2);
    let api_key = Some(ApiKey::new(KEY).expect("a valid key"));
    let server = common::start(dir.path(), ServeConfig { api_key, ..ServeConfig::default() });
    let client = |key: &str| {
        RemotePolicy::new(RemoteConfig {
            base_url: server.base_url(),
            model: "base".to_string(),
            api_key: Some(key.to_string()),
            max_retries: 3,
            backoff_initial_ms: 1,
            backoff_max_ms: 5,
            ..RemoteConfig::default()
        })
        .expect("a valid client")
    };
    let asked = request("Mira has 5 keys.", 0.0, 0, 8);
    let keyed = client(KEY);
    assert_eq!(
        keyed.chat(asked.clone()).expect("the key admits it"),
        local(dir.path()).chat(asked.clone()).expect("ok")
    );
    let wrong = client(&format!("{}x", &KEY[..KEY.len() - 1]));
    let error = wrong.chat(asked).expect_err("a wrong key");
    assert!(matches!(error, PolicyError::Remote(RemoteError::Status { status: 401, .. })), "{error}");
    assert_eq!(wrong.stats().retries, 0, "a 401 is permanent");
}

#[test]
fn admin_endpoints_answer_403_naming_the_flag_unless_runtime_loading_is_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 3);
    let server = common::start(dir.path(), ServeConfig::default());
    let admin_routes: Vec<_> =
        every_route(dir.path()).into_iter().filter(|(_, path, _)| !path.contains("completions")).skip(2).collect();
    assert_eq!(admin_routes.len(), 5);
    for (method, path, body) in admin_routes.iter().cloned().chain([("POST", "/v1/load_lora_adapter", "{".to_string())])
    {
        let answer = send(&server, method, path, &body, None);
        assert_eq!(answer.status, 403, "{path}: {}", answer.body);
        let message = answer.body["error"]["message"].as_str().expect("a message");
        assert!(message.contains("--allow-runtime-loading") && message.contains("--allowed-path"), "{message}");
        assert_eq!(answer.body["error"]["code"], "runtime_loading_disabled");
    }
    assert_eq!(served_names(&server), ["base"]);
    assert_eq!(send(&server, "POST", "/v1/chat/completions", &chat("base"), None).status, 200, "generation works");

    // On, but without an allowed directory: nothing loads; unloading needs no path.
    let server = common::start(
        dir.path(),
        ServeConfig { runtime_loading: RuntimeLoading::allowed(Vec::new()), ..ServeConfig::default() },
    );
    for (_, path, body) in &admin_routes {
        let answer = send(&server, "POST", path, body, None);
        if path.contains("unload") {
            assert_eq!(answer.status, 404, "{path}: nothing of that name is loaded: {}", answer.body);
        } else {
            assert_eq!(answer.status, 403, "{path}: {}", answer.body);
            assert_eq!(answer.body["error"]["code"], "path_not_allowed");
            assert!(answer.body["error"]["message"].as_str().is_some_and(|m| m.contains("--allowed-path")));
        }
    }
    assert_eq!(served_names(&server), ["base"]);
}

/// `root/allowed/{base, adapter, link-in, link-out, link-dangling, linked-weights}` and
/// `root/outside/{adapter, base}`: two adapters of the base, a copy of the base, and symlinks
/// inside the allowed directory to both sides.
fn allowed_and_outside(root: &Path) {
    let (allowed, outside) = (root.join("allowed"), root.join("outside"));
    write_model(&allowed.join("base"), 4);
    write_adapter(&allowed.join("base"), &allowed.join("adapter"), 5);
    write_adapter(&allowed.join("base"), &outside.join("adapter"), 6);
    std::fs::create_dir_all(outside.join("base")).expect("dir");
    for entry in std::fs::read_dir(allowed.join("base")).expect("the base").flatten() {
        std::fs::copy(entry.path(), outside.join("base").join(entry.file_name())).expect("copied");
    }
    let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, allowed.join(name)).expect("a symlink");
    link(&allowed.join("adapter"), "link-in");
    link(&outside.join("adapter"), "link-out");
    link(&outside.join("missing"), "link-dangling");
    let mixed = allowed.join("linked-weights");
    std::fs::create_dir_all(&mixed).expect("dir");
    std::fs::copy(outside.join("adapter/adapter_config.json"), mixed.join("adapter_config.json")).expect("copied");
    let weights = outside.join("adapter/adapter_model.safetensors");
    std::os::unix::fs::symlink(weights, mixed.join("adapter_model.safetensors")).expect("a symlink");
}

#[test]
fn loads_read_only_under_allowed_paths_and_every_escape_gets_the_same_reply() {
    let root = tempfile::tempdir().expect("tempdir");
    allowed_and_outside(root.path());
    let (allowed, outside) = (root.path().join("allowed"), root.path().join("outside"));
    let server = common::start(&allowed.join("base"), loading_from(&[&allowed]));
    let load = |name: &str, path: &Path| {
        send(&server, "POST", "/v1/load_lora_adapter", &json!({"lora_name": name, "lora_path": path}).to_string(), None)
    };
    let escapes = [
        outside.join("adapter"),
        outside.join("missing"),
        outside.join("adapter/adapter_config.json"),
        allowed.join("../outside/adapter"),
        allowed.join("../outside/missing"),
        allowed.join("adapter/../../outside/adapter"),
        allowed.join("link-out"),
        allowed.join("link-out/../../outside/adapter"),
        allowed.join("link-dangling"),
        allowed.join("link-dangling/deeper"),
        allowed.join("linked-weights"),
        "/etc".into(),
        "/no/such/directory".into(),
        "".into(),
    ];
    let first = load("escape", &escapes[0]);
    assert_eq!(first.status, 403, "{}", first.body);
    assert_eq!(first.body["error"]["code"], "path_not_allowed");
    assert_eq!(first.body["error"]["param"], "lora_path");
    for path in &escapes {
        let answer = load("escape", path);
        assert_eq!((answer.status, &answer.body), (first.status, &first.body), "{}", path.display());
    }
    let reload = |path: &Path| {
        send(&server, "POST", "/update_weights_from_disk", &json!({"model_path": path}).to_string(), None)
    };
    let outside_base = reload(&outside.join("base"));
    assert_eq!(outside_base.status, 403, "{}", outside_base.body);
    assert_eq!(outside_base.body["error"]["param"], "model_path");
    for path in [outside.join("missing"), allowed.join("../outside/base"), allowed.join("link-out")] {
        assert_eq!(reload(&path).body, outside_base.body, "{}", path.display());
    }
    assert_eq!(served_names(&server), ["base"], "nothing outside was loaded");

    assert_eq!(load("adapter", &allowed.join("adapter")).status, 200);
    assert_eq!(load("via-link", &allowed.join("link-in")).status, 200, "a symlink that stays inside");
    assert_eq!(load("dotted", &allowed.join("adapter/../adapter")).status, 200);
    let missing_inside = load("missing", &allowed.join("missing"));
    assert_eq!(missing_inside.status, 400, "inside, the server may say what is wrong: {}", missing_inside.body);
    assert_eq!(reload(&allowed.join("base")).status, 200);
    let roots: Vec<_> = server.registry().list().into_iter().map(|info| info.root).collect();
    let canonical = allowed.canonicalize().expect("canonical");
    assert_eq!(roots[1..], [canonical.join("adapter"), canonical.join("adapter"), canonical.join("adapter")]);
}

fn start_on(host: &str, config: ServeConfig) -> Result<Server, ServeError> {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path(), 7);
    let registry = ModelRegistry::open(dir.path(), None, LoadSettings::default()).expect("the model loads");
    Server::start(&ServeConfig { host: host.to_string(), port: 0, ..config }, registry)
}

#[test]
fn a_server_without_a_key_starts_only_on_loopback_unless_told_it_is_on_purpose() {
    let error = start_on("0.0.0.0", ServeConfig::default()).err().expect("refused");
    let message = error.to_string();
    assert!(matches!(error, ServeError::OpenWithoutKey { .. }), "{message}");
    for needle in ["loopback", "--api-key", "WHALE_API_KEY", "--insecure-no-auth"] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    assert!(start_on("localhost", ServeConfig::default()).is_ok());
    assert!(start_on("127.0.0.1", ServeConfig::default()).is_ok());
    let keyed = ServeConfig { api_key: Some(ApiKey::new(KEY).expect("a valid key")), ..ServeConfig::default() };
    assert!(start_on("0.0.0.0", keyed).is_ok());
    assert!(start_on("0.0.0.0", ServeConfig { insecure_no_auth: true, ..ServeConfig::default() }).is_ok());
    let missing = RuntimeLoading::allowed(vec!["/no/such/allowed/dir".into()]);
    let error = start_on("127.0.0.1", ServeConfig { runtime_loading: missing, ..ServeConfig::default() });
    assert!(error.err().expect("refused").to_string().contains("/no/such/allowed/dir"));
}
