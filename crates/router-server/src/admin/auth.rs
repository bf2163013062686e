//! The admin token check shared by the gRPC service and the HTTP admin endpoints.

use router_core::ct_eq;

/// Why an admin call was refused before it did anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No admin token is configured: admin is off.
    Disabled,
    /// The token is missing or wrong.
    BadToken,
}

/// Compares the presented token with the configured one in constant time.
pub fn check_token(configured: Option<&str>, presented: Option<&str>) -> Result<(), Denied> {
    let Some(token) = configured else {
        return Err(Denied::Disabled);
    };
    match presented.map(str::trim) {
        Some(p) if ct_eq(p.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(Denied::BadToken),
    }
}

/// The token of an `Authorization: Bearer <token>` value.
pub fn bearer(v: Option<&str>) -> Option<&str> {
    v.and_then(|v| {
        v.strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
    })
}

/// The admin token check on an HTTP request's headers.
pub fn admin_headers(configured: Option<&str>, headers: &http::HeaderMap) -> Result<(), Denied> {
    let presented = bearer(
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    check_token(configured, presented)
}

/// Whether `headers` carry the configured admin token.
pub fn is_admin(configured: Option<&str>, headers: &http::HeaderMap) -> bool {
    admin_headers(configured, headers).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        assert_eq!(check_token(None, Some("x")), Err(Denied::Disabled));
        assert_eq!(
            check_token(Some("secret-token-123456"), None),
            Err(Denied::BadToken)
        );
        assert_eq!(
            check_token(Some("secret-token-123456"), Some("secret-token-12345")),
            Err(Denied::BadToken)
        );
        assert!(check_token(Some("secret-token-123456"), Some("secret-token-123456")).is_ok());
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
    }
}
