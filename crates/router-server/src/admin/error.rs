//! Why an admin call failed, as one typed enum, and the one place each where it becomes a
//! gRPC status (`routerctl`) and an HTTP error (the vllm-router-style endpoints).

use super::auth::Denied;
use crate::response::ApiError;
use crate::state::ChangeError;
use http::StatusCode;
use router_cluster::MembershipError;
use router_core::Rejection;
use tonic::Status;

/// An admin call that did not take effect.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdminError {
    /// No admin token configured.
    #[error("admin is disabled on this router: set admin_token (ROUTER_ADMIN_TOKEN)")]
    Disabled,
    /// Missing or wrong token.
    #[error("missing or wrong admin token")]
    BadToken,
    /// The server URL is missing or is not an engine server URL.
    #[error("{0}")]
    InvalidUrl(String),
    /// Another parameter is missing or malformed.
    #[error("{0}")]
    InvalidRequest(String),
    /// The state machine refused the change.
    #[error("{0}")]
    Rejected(Rejection),
    /// A router peer could not be added or removed.
    #[error("{0}")]
    Membership(MembershipError),
    /// The change could not be made now (no leader, the leader unreachable).
    #[error("{0}")]
    Unavailable(String),
}

impl From<Denied> for AdminError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Disabled => AdminError::Disabled,
            Denied::BadToken => AdminError::BadToken,
        }
    }
}

impl From<ChangeError> for AdminError {
    fn from(e: ChangeError) -> Self {
        AdminError::Unavailable(e.to_string())
    }
}

impl From<AdminError> for Status {
    fn from(e: AdminError) -> Status {
        let m = e.to_string();
        match e {
            AdminError::Disabled => Status::permission_denied(m),
            AdminError::BadToken => Status::unauthenticated(m),
            AdminError::InvalidUrl(_) | AdminError::InvalidRequest(_) => {
                Status::invalid_argument(m)
            }
            AdminError::Rejected(r) => match r {
                Rejection::UnknownServer(_) => Status::not_found(m),
                Rejection::InvalidServer { .. } => Status::invalid_argument(m),
                Rejection::RetiredPeer(_) => Status::failed_precondition(m),
            },
            AdminError::Membership(me) => match me {
                MembershipError::NotLeader(_) | MembershipError::Raft(_) => Status::unavailable(m),
                MembershipError::RetiredId(_) | MembershipError::LastVoter => {
                    Status::failed_precondition(m)
                }
                MembershipError::AlreadyVoter(_) => Status::already_exists(m),
                MembershipError::NotMember(_) => Status::not_found(m),
                MembershipError::CatchUpTimeout { .. } => Status::deadline_exceeded(m),
            },
            AdminError::Unavailable(_) => Status::unavailable(m),
        }
    }
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> ApiError {
        let m = e.to_string();
        match e {
            AdminError::Disabled => ApiError::admin_disabled(),
            AdminError::BadToken => ApiError::admin_unauthorized(),
            AdminError::InvalidUrl(_) => ApiError::bad_request("invalid_url", m),
            AdminError::InvalidRequest(_) => ApiError::bad_request("invalid_parameter", m),
            AdminError::Rejected(r) => {
                let status = match r {
                    Rejection::UnknownServer(_) => StatusCode::NOT_FOUND,
                    Rejection::InvalidServer { .. } => StatusCode::BAD_REQUEST,
                    Rejection::RetiredPeer(_) => StatusCode::CONFLICT,
                };
                ApiError::admin_rejected(status, m)
            }
            AdminError::Membership(_) | AdminError::Unavailable(_) => {
                ApiError::admin_unavailable(m)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_maps_to_its_status() {
        let unknown = AdminError::Rejected(Rejection::UnknownServer("http://a:1".into()));
        assert_eq!(Status::from(unknown.clone()).code(), tonic::Code::NotFound);
        assert_eq!(ApiError::from(unknown).status, StatusCode::NOT_FOUND);
        let invalid = AdminError::Rejected(Rejection::InvalidServer {
            url: "x".into(),
            reason: "bad".into(),
        });
        assert_eq!(
            Status::from(invalid.clone()).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(ApiError::from(invalid).status, StatusCode::BAD_REQUEST);
        assert_eq!(
            Status::from(AdminError::Disabled).code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(ApiError::from(AdminError::BadToken).status, 401);
        assert_eq!(
            Status::from(AdminError::Membership(MembershipError::RetiredId(4))).code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            ApiError::from(AdminError::Unavailable("no leader".into())).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
