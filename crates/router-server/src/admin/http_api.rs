//! The vllm-router-compatible HTTP endpoints on the client port: `POST /add_worker?url=`,
//! `POST /remove_worker?url=` and `GET /list_workers`, with the admin token required. Like
//! the gRPC service they go through [`RoutingState::change`].

use super::auth::{bearer, check_token};
use super::error::AdminError;
use super::self_check::not_this_router;
use super::servers::server_infos;
use crate::client::UpstreamClient;
use crate::identity::RouterId;
use crate::response::{json_response, ApiError, RespBody};
use crate::state::RoutingState;
use http::{header, Method, Request, Response, StatusCode};
use router_core::{parse_upstream_url, Command, Outcome};

/// What the endpoints need.
pub struct AdminHttp<'a> {
    /// The routing state to change.
    pub state: &'a dyn RoutingState,
    /// For asking a joining URL whether it is this router.
    pub client: &'a UpstreamClient,
    /// This router's id.
    pub id: &'a RouterId,
    /// The configured admin token (None: admin disabled).
    pub token: Option<&'a str>,
    /// KV capacity of a joined server's ranks when the call gives none.
    pub default_capacity: u64,
}

/// One query parameter, percent-decoded.
fn query_param(uri: &http::Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Serves one of the three endpoints (`path`).
pub async fn handle<B>(
    a: &AdminHttp<'_>,
    req: Request<B>,
    path: &str,
) -> Result<Response<RespBody>, ApiError> {
    let presented = bearer(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    check_token(a.token, presented).map_err(|d| ApiError::from(AdminError::from(d)))?;
    let (want, allow) = if path == "/list_workers" {
        (Method::GET, "GET")
    } else {
        (Method::POST, "POST")
    };
    if req.method() != want {
        return Err(ApiError::method_not_allowed(req.method(), path, allow));
    }
    if path == "/list_workers" {
        let servers = server_infos(&a.state.topology());
        let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
        let workers: Vec<serde_json::Value> = servers
            .iter()
            .map(|s| {
                serde_json::json!({"url": s.url, "ranks": s.ranks, "capacity_tokens": s.capacity_tokens,
                    "weight": s.weight, "draining": s.draining, "healthy": s.up, "inflight": s.inflight})
            })
            .collect();
        return Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"urls": urls, "workers": workers}),
        ));
    }
    let bad_url = |m: String| ApiError::from(AdminError::InvalidUrl(m));
    let raw = query_param(req.uri(), "url")
        .ok_or_else(|| bad_url("pass the server as ?url=http://host:port".into()))?;
    let parsed =
        parse_upstream_url(&raw).map_err(|e| bad_url(format!("url '{}': {e}", raw.trim())))?;
    let url = parsed.url;
    let bad = |m: String| ApiError::from(AdminError::InvalidRequest(m));
    let num = |k: &str| -> Result<Option<f64>, ApiError> {
        match query_param(req.uri(), k) {
            None => Ok(None),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| bad(format!("{k} must be a positive number"))),
        }
    };
    let cmd = if path == "/add_worker" {
        not_this_router(a.client, a.id, &url, &parsed.authority).await?;
        Command::JoinServer {
            url: url.clone(),
            ranks: num("ranks")?.map_or(1, |v| v as u32),
            capacity_tokens: num("capacity_tokens")?.map_or(a.default_capacity, |v| v as u64),
            weight: num("weight")?.unwrap_or(1.0),
        }
    } else {
        Command::LeaveServer { url: url.clone() }
    };
    let done = a.state.change(cmd).await.map_err(AdminError::from)?;
    let note = done.note();
    match done.outcome {
        Outcome::Rejected(r) => Err(AdminError::Rejected(r).into()),
        Outcome::Joined(ranks) => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok", "message": format!("added {url}: {note}"), "url": url,
                "ranks": ranks, "confirmed_peers": done.confirmed, "unconfirmed_peers": done.unconfirmed}),
        )),
        Outcome::Ok => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok", "message": format!("removed {url}: {note}"), "url": url,
                "confirmed_peers": done.confirmed, "unconfirmed_peers": done.unconfirmed}),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_decoded() {
        let u: http::Uri = "/add_worker?url=http%3A%2F%2F127.0.0.1%3A9001&weight=2"
            .parse()
            .unwrap();
        assert_eq!(
            query_param(&u, "url").as_deref(),
            Some("http://127.0.0.1:9001")
        );
        assert_eq!(query_param(&u, "weight").as_deref(), Some("2"));
        assert_eq!(query_param(&u, "ranks"), None);
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
