//! Who may talk to the server: with an API key, every request on every route must carry
//! `Authorization: Bearer KEY` (vLLM's, SGLang's and llama.cpp's `--api-key`), and anything else
//! gets a 401 before its body is read. Without a key the server answers anyone who reaches it,
//! which [`crate::Server::start`] allows on loopback only unless told otherwise.
//!
//! The key is compared in constant time by [`constant_time_eq`], ten lines here rather than the
//! `subtle` crate: `subtle`'s slice comparison returns at once when the lengths differ, which
//! tells a client the key's length; this one takes a time that depends only on what the client
//! sent.

use hyper::header::{HeaderMap, AUTHORIZATION};

use crate::error::ApiError;

/// A key the server cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the API key {0}")]
pub struct InvalidApiKey(&'static str);

/// The key clients must send as `Authorization: Bearer KEY`. Its `Debug` does not show it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// A non-empty key of visible ASCII characters (what an HTTP header carries unchanged).
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidApiKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidApiKey("must not be empty"));
        }
        if !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(InvalidApiKey("must be visible ASCII characters, without spaces"));
        }
        Ok(Self(key))
    }

    /// Whether `presented` is this key, compared in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl PartialEq for ApiKey {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}

/// Whether `presented` equals `expected`, in a time that depends only on `presented`'s length:
/// every byte is compared whatever the first difference, and `expected`, read cyclically,
/// never decides how many bytes are looked at.
pub fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    if expected.is_empty() {
        return presented.is_empty();
    }
    let mut difference = expected.len() ^ presented.len();
    for (index, byte) in presented.iter().enumerate() {
        // black_box keeps the compiler from stopping at the first difference.
        difference = std::hint::black_box(difference | usize::from(expected[index % expected.len()] ^ byte));
    }
    difference == 0
}

/// Admits the request when the server has no key, or when its `Authorization` header is
/// `Bearer KEY` with the server's key; otherwise a 401.
pub fn authorize(key: Option<&ApiKey>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = key else { return Ok(()) };
    match bearer_token(headers) {
        None => Err(ApiError::unauthorized("this server requires an API key: send it as `Authorization: Bearer KEY`")),
        Some(token) if key.matches(token) => Ok(()),
        Some(_) => Err(ApiError::unauthorized("incorrect API key")),
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (the scheme in any case).
fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(AUTHORIZATION)?.as_bytes();
    let space = value.iter().position(|&byte| byte == b' ')?;
    let (scheme, token) = value.split_at(space);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(authorization).expect("a header value"));
        headers
    }

    #[test]
    fn only_the_exact_key_compares_equal() {
        assert!(constant_time_eq(b"s3cret-key", b"s3cret-key"));
        assert!(!constant_time_eq(b"s3cret-key", b"s3cret-kez"), "the last byte differs");
        assert!(!constant_time_eq(b"s3cret-key", b"s3cret-ke"), "a prefix");
        assert!(!constant_time_eq(b"s3cret-key", b"s3cret-keys3cret-key"), "the key twice");
        assert!(!constant_time_eq(b"s3cret-key", b""));
        assert!(!constant_time_eq(b"ab", b"abab"), "cyclic reading does not admit repeats");
        assert!(constant_time_eq(b"", b"") && !constant_time_eq(b"", b"x"));
    }

    #[test]
    fn a_request_is_admitted_only_with_the_bearer_key() {
        let key = ApiKey::new("s3cret-key").expect("a valid key");
        assert_eq!(authorize(None, &HeaderMap::new()), Ok(()));
        assert_eq!(authorize(Some(&key), &headers("Bearer s3cret-key")), Ok(()));
        assert_eq!(authorize(Some(&key), &headers("bearer  s3cret-key")), Ok(()));
        for refused in ["Bearer s3cret-kez", "Bearer", "Basic s3cret-key", "s3cret-key", "Bearer s3cret-key2"] {
            let error = authorize(Some(&key), &headers(refused)).expect_err(refused);
            assert_eq!((error.status, error.code), (401, Some("invalid_api_key")), "{refused}");
        }
        let missing = authorize(Some(&key), &HeaderMap::new()).expect_err("no header");
        assert!(missing.message.contains("Authorization: Bearer"), "{}", missing.message);
        assert_eq!(missing.header, Some(("www-authenticate", "Bearer")));
    }

    #[test]
    fn keys_must_be_sendable_and_are_never_printed() {
        assert!(ApiKey::new("").is_err());
        assert!(ApiKey::new("has space").is_err());
        assert!(ApiKey::new("tab\t").is_err());
        let key = ApiKey::new("s3cret-key").expect("a valid key");
        assert!(!format!("{key:?}").contains("s3cret"));
    }
}
