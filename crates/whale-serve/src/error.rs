//! Errors in the OpenAI shape, `{"error": {"message", "type", "param", "code"}}`, so every
//! OpenAI client raises its own exception class for them (`openai.NotFoundError` for a 404,
//! `BadRequestError` for a 400, ...). Every failure a request can cause ends here with a 4xx or
//! 5xx status; nothing a client sends panics the server.

use serde_json::{json, Value};
use whale_policy::PolicyError;

/// An error reply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("HTTP {status}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's error `type`: `invalid_request_error`, `not_found_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code, e.g. `context_length_exceeded`, `model_not_found`.
    pub code: Option<&'static str>,
    /// A header the reply carries (lower-case name, value): `allow` on a 405,
    /// `www-authenticate` on a 401.
    pub header: Option<(&'static str, &'static str)>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None, header: None }
    }

    /// 400: the request is not a valid request (JSON, types, values, unsupported fields).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message)
    }

    /// 404 for a `model` no entry of the registry has.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(404, "not_found_error", format!("The model `{model}` does not exist."))
            .with_param("model")
            .with_code("model_not_found")
    }

    /// 404 for something else the request names that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found_error", message)
    }

    /// 404 for a path the server does not serve.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self::not_found(format!("no route for {method} {path}"))
    }

    /// 405: a known path asked with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str, allowed: &'static str) -> Self {
        let error = Self::new(405, "invalid_request_error", format!("{path} accepts {allowed}, not {method}"));
        Self { header: Some(("allow", allowed)), ..error }
    }

    /// 401: the request does not carry the server's API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        let error = Self::new(401, "invalid_request_error", message).with_code("invalid_api_key");
        Self { header: Some(("www-authenticate", "Bearer")), ..error }
    }

    /// 403: the server does not let clients do this (an admin endpoint turned off, a path
    /// outside the directories it may read).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "permission_error", message)
    }

    /// 408: the client did not send the whole body in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(408, "invalid_request_error", message)
    }

    /// 413: the body is over the server's limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "invalid_request_error", format!("the request body is over the limit of {limit} bytes"))
    }

    /// 422: a valid request the model cannot take (the chat template or tokenizer refused it).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "invalid_request_error", message)
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message)
    }

    /// 429: the server has as many generation requests running and queued as it takes; the
    /// client is told to come back in a second (`Retry-After`), as vLLM and TGI tell it.
    pub fn queue_full(limit: usize) -> Self {
        let message = format!(
            "the server is at its limit of {limit} generation requests running or queued (--max-queued-requests); retry after a second"
        );
        let error = Self::new(429, "rate_limit_error", message).with_code("queue_full");
        Self { header: Some(("retry-after", "1")), ..error }
    }

    /// 503 while the server stops: the request was not run, or was cut off past the grace period.
    pub fn stopping() -> Self {
        let error =
            Self::unavailable("the server is stopping; retry against a server that runs").with_code("server_stopping");
        Self { header: Some(("retry-after", "1")), ..error }
    }

    /// 503: the server cannot serve the request now; retrying may work.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "server_error", message)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// The reply to a generation that failed: the request's fault (4xx) or the server's (5xx).
    pub fn from_policy(error: PolicyError, prompt_field: &str) -> Self {
        match error {
            PolicyError::PromptTooLong { .. } | PolicyError::ContextExceeded(_) => {
                Self::bad_request(error.to_string()).with_param(prompt_field).with_code("context_length_exceeded")
            }
            PolicyError::InvalidPrompt(_) => Self::bad_request(error.to_string()).with_param(prompt_field),
            PolicyError::Sampling(_) => Self::bad_request(error.to_string()),
            PolicyError::TemplateRefused(_) => {
                Self::unprocessable(error.to_string()).with_param(prompt_field).with_code("template_refused")
            }
            PolicyError::Template(_) | PolicyError::Tokenizer(_) => {
                Self::unprocessable(error.to_string()).with_param(prompt_field)
            }
            PolicyError::EngineStopped => Self::unavailable(error.to_string()),
            // Only a client that has gone away cancels, so nobody reads this reply.
            PolicyError::Cancelled => Self::bad_request(error.to_string()),
            PolicyError::Model(_) | PolicyError::Remote(_) => Self::internal(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_the_openai_shape_and_policy_errors_their_status() {
        let body = ApiError::model_not_found("m").body();
        assert_eq!(body["error"]["type"], "not_found_error");
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["code"], "model_not_found");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("`m`")));
        let too_long = PolicyError::PromptTooLong { prompt_tokens: 9, context_window: 8 };
        let error = ApiError::from_policy(too_long, "messages");
        assert_eq!(
            (error.status, error.code, error.param.as_deref()),
            (400, Some("context_length_exceeded"), Some("messages"))
        );
        assert_eq!(ApiError::from_policy(PolicyError::EngineStopped, "prompt").status, 503);
        assert_eq!(ApiError::from_policy(PolicyError::Model("oom".into()), "prompt").status, 500);
    }
}
