//! Responses the router writes itself, and the one place where a failure becomes an HTTP
//! response: an OpenAI-style `{"error": {"message", "type", "code", "param"}}` body, or on
//! the Anthropic endpoint `{"type": "error", "error": {"type", "message"}}`, with the right
//! status and headers.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

/// Boxed error for bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every response body the router sends.
pub type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body.
pub fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<RespBody> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Which API's error shape a client expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// OpenAI (and vLLM, SGLang): `{"error": {"message", "type", "code", "param"}}`.
    OpenAi,
    /// Anthropic `/v1/messages`: `{"type": "error", "error": {"type", "message"}}`, so the
    /// Anthropic SDKs raise their typed errors instead of showing a raw dict.
    Anthropic,
}

/// A request that ends in an error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI error type.
    pub kind: &'static str,
    /// Machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Methods the path takes (the `Allow` header of a 405).
    pub allow: Option<&'static str>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            kind,
            code,
            message: message.into(),
            allow: None,
        }
    }

    /// 400: the body is not what the endpoint takes.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "missing or invalid API key (send 'Authorization: Bearer <key>')",
        )
    }

    /// 401 on an admin endpoint: missing or wrong admin token.
    pub fn admin_unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_admin_token",
            "missing or invalid admin token (send 'Authorization: Bearer <admin_token>')",
        )
    }

    /// 403: admin endpoints are off because no admin token is configured.
    pub fn admin_disabled() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "admin_disabled",
            "admin endpoints are disabled: set admin_token (ROUTER_ADMIN_TOKEN)",
        )
    }

    /// An admin change refused (404 unknown server, 400 invalid, 409 conflicting).
    pub fn admin_rejected(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_request_error", "admin_rejected", message)
    }

    /// 503: the change could not be made now (no leader, peers unreachable).
    pub fn admin_unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "admin_unavailable",
            message,
        )
    }

    /// 404.
    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("no route for {path}"),
        )
    }

    /// 405, with the methods the path takes.
    pub fn method_not_allowed(method: &http::Method, path: &str, allow: &'static str) -> Self {
        let mut e = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("{method} is not allowed on {path} (use {allow})"),
        );
        e.allow = Some(allow);
        e
    }

    /// 413.
    pub fn body_too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    /// 413: the prompt fields hold more JSON values than a body this size may.
    pub fn too_many_values(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "too_many_values",
            message,
        )
    }

    /// 431.
    pub fn headers_too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            "headers_too_large",
            format!("request headers exceed the limit of {limit} bytes"),
        )
    }

    /// 408: the client was too slow sending its body.
    pub fn client_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            "timed out reading the request body",
        )
    }

    /// 508: the request came back to this router (its upstream is a router of its own
    /// cluster, or routers forward to each other in a circle).
    pub fn loop_detected(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::LOOP_DETECTED,
            "invalid_request_error",
            "routing_loop",
            message,
        )
    }

    /// 503: nothing to send the request to.
    pub fn no_upstream() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "no_healthy_upstream",
            "no healthy upstream is available",
        )
    }

    /// 502: every attempt failed before the first byte.
    pub fn upstream_failed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_unavailable",
            detail,
        )
    }

    /// 504: the upstream did not answer in time.
    pub fn upstream_timeout(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_error",
            "upstream_timeout",
            detail,
        )
    }

    /// Anthropic's error type for this failure.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body in `shape`.
    pub fn json(&self, shape: ErrorShape) -> serde_json::Value {
        error_json(
            shape,
            &self.message,
            self.kind,
            self.code,
            self.anthropic_type(),
        )
    }

    /// The response, in the error shape of the endpoint that failed.
    pub fn into_response(self, shape: ErrorShape) -> Response<RespBody> {
        let mut r = json_response(self.status, &self.json(shape));
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(allow) = self.allow {
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        r
    }
}

/// An error object in `shape`; also the payload of an SSE `error` event after the first
/// byte (the relay can no longer change the status).
pub fn error_json(
    shape: ErrorShape,
    message: &str,
    kind: &str,
    code: &str,
    anthropic_type: &str,
) -> serde_json::Value {
    match shape {
        ErrorShape::OpenAi => serde_json::json!({
            "error": {"message": message, "type": kind, "code": code, "param": null}
        }),
        ErrorShape::Anthropic => serde_json::json!({
            "type": "error",
            "error": {"type": anthropic_type, "message": message}
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes() {
        let e = ApiError::bad_request("invalid_json", "nope");
        assert_eq!(e.json(ErrorShape::OpenAi)["error"]["code"], "invalid_json");
        let a = e.json(ErrorShape::Anthropic);
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "invalid_request_error");
        assert_eq!(a["error"]["message"], "nope");
        assert_eq!(
            ApiError::no_upstream().json(ErrorShape::Anthropic)["error"]["type"],
            "overloaded_error"
        );
    }

    #[test]
    fn method_not_allowed_says_which() {
        let r = ApiError::method_not_allowed(&http::Method::GET, "/v1/chat/completions", "POST")
            .into_response(ErrorShape::OpenAi);
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[header::ALLOW], "POST");
    }
}
