//! The one place where failures become HTTP responses: an OpenAI-style
//! `{"error": {"message", "type", "code", "param"}}` body with the right status.

use crate::body::{full, RespBody};
use http::{header, Response, StatusCode};

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

    /// 404/409-style refusal of an admin change, with the state machine's reason.
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

    /// 405.
    pub fn method_not_allowed(method: &http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("{method} is not allowed on {path}"),
        )
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

    /// The JSON body.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.code,
                "param": null,
            }
        })
    }

    /// The response.
    pub fn into_response(self) -> Response<RespBody> {
        let mut r = Response::new(full(serde_json::to_vec(&self.json()).unwrap_or_default()));
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}
