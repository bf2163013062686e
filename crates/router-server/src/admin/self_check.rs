//! A server joins only if it is not this router: the URL's `/health` is asked once, and an
//! answer that carries this router's id (this process, or any peer of its cluster) refuses
//! the join. A URL that does not answer yet is accepted (an engine may start later; the
//! data plane refuses loops on the wire anyway).

use super::error::AdminError;
use crate::client::UpstreamClient;
use crate::identity::{self, RouterId};
use bytes::Bytes;
use http_body_util::Full;
use std::time::Duration;

/// How long the join waits for the URL's `/health`.
const PROBE: Duration = Duration::from_secs(1);

/// Refuses `url` (normalized, with `authority`) when it answers as this router.
pub async fn not_this_router(
    client: &UpstreamClient,
    me: &RouterId,
    url: &str,
    authority: &str,
) -> Result<(), AdminError> {
    let Ok(req) = http::Request::get(format!("http://{authority}/health"))
        .header(identity::HEADER, me.header())
        .body(Full::new(Bytes::new()))
    else {
        return Ok(());
    };
    match tokio::time::timeout(PROBE, client.request(req)).await {
        Ok(Ok(resp)) if me.is_in(resp.headers()) => Err(AdminError::InvalidUrl(format!(
            "{url} is this router (or a peer of its cluster), not an engine: joining it would \
             send requests back into the router"
        ))),
        _ => Ok(()),
    }
}
