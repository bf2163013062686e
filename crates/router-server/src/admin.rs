//! Operator calls: the admin gRPC service that `routerctl` talks to (on the peer port), and
//! the vllm-router-compatible HTTP endpoints (`/add_worker`, `/remove_worker`,
//! `/list_workers`) on the client port. Both need the admin token; both go through
//! [`RoutingState::change`], so a change returns once every reachable peer routes by it.

use crate::body::RespBody;
use crate::cluster::ClusterState;
use crate::config::parse_upstream_url;
use crate::error::ApiError;
use crate::proxy::{json_response, Ctx};
use crate::state::RoutingState;
use crate::topology::Topology;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use router_cluster::node::MembershipError;
use router_core::{ct_eq, Command, Outcome};
use router_proto::v1::admin_client::AdminClient;
use router_proto::v1::admin_server::Admin;
use router_proto::v1::{
    AddPeerRequest, AdminReply, DrainRequest, Empty, JoinRequest, PeerInfo, RemovePeerRequest,
    ServerInfo, ServerRequest, ServersReply, StatusReply,
};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

/// Why an admin token check failed.
enum Denied {
    Disabled,
    BadToken,
}

fn check_token(configured: Option<&str>, presented: Option<&str>) -> Result<(), Denied> {
    let Some(token) = configured else {
        return Err(Denied::Disabled);
    };
    match presented.map(str::trim) {
        Some(p) if ct_eq(p.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(Denied::BadToken),
    }
}

fn bearer(v: Option<&str>) -> Option<&str> {
    v.and_then(|v| {
        v.strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
    })
}

/// Checks a URL the way config does and normalizes it (no trailing slash).
pub fn normalize_url(url: &str) -> Result<String, String> {
    let u = url.trim().trim_end_matches('/');
    parse_upstream_url(u)?;
    Ok(u.to_owned())
}

/// Servers as the admin APIs report them, from the lock-free topology snapshot.
pub fn server_infos(topo: &Topology) -> Vec<ServerInfo> {
    topo.upstreams
        .iter()
        .map(|u| {
            let ranks: Vec<_> = topo.ranks_of(u).collect();
            ServerInfo {
                url: u.url.to_string(),
                ranks: ranks.iter().map(|r| r.id).collect(),
                capacity_tokens: ranks.first().map_or(0, |r| r.capacity()),
                weight: ranks.first().map_or(1.0, |r| r.weight()),
                draining: !u.accepting.load(Relaxed),
                up: u.up.load(Relaxed),
                inflight: ranks.iter().map(|r| r.inflight.load(Relaxed)).sum(),
            }
        })
        .collect()
}

/// The admin gRPC service.
pub struct AdminService {
    state: Arc<ClusterState>,
    token: Option<String>,
    default_capacity: u64,
}

impl AdminService {
    /// Serves `state`; `token` unset refuses every call.
    pub fn new(state: Arc<ClusterState>, token: Option<String>, default_capacity: u64) -> Self {
        AdminService {
            state,
            token,
            default_capacity,
        }
    }

    fn auth<T>(&self, req: &GrpcRequest<T>) -> Result<(), Status> {
        let presented = bearer(
            req.metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
        );
        match check_token(self.token.as_deref(), presented) {
            Ok(()) => Ok(()),
            Err(Denied::Disabled) => Err(Status::permission_denied(
                "admin is disabled on this router: set admin_token (ROUTER_ADMIN_TOKEN)",
            )),
            Err(Denied::BadToken) => Err(Status::unauthenticated("missing or wrong admin token")),
        }
    }

    async fn apply(&self, cmd: Command) -> Result<GrpcResponse<AdminReply>, Status> {
        let done = self.state.change(cmd).await.map_err(Status::unavailable)?;
        match done.outcome {
            Outcome::Rejected(m) => Err(Status::failed_precondition(m)),
            Outcome::Joined(ranks) => Ok(GrpcResponse::new(AdminReply {
                ok: true,
                message: done.note,
                ranks,
            })),
            Outcome::Ok => Ok(GrpcResponse::new(AdminReply {
                ok: true,
                message: done.note,
                ranks: Vec::new(),
            })),
        }
    }

    /// Membership changes happen on the leader: forward there with the caller's token.
    async fn on_leader<T, F, Fut>(
        &self,
        req: &GrpcRequest<T>,
        addr: Option<String>,
        msg: T,
        call: F,
    ) -> Result<GrpcResponse<AdminReply>, Status>
    where
        F: FnOnce(AdminClient<tonic::transport::Channel>, GrpcRequest<T>) -> Fut,
        Fut: std::future::Future<Output = Result<GrpcResponse<AdminReply>, Status>>,
    {
        let addr = addr.ok_or_else(|| Status::unavailable("no leader at the moment; retry"))?;
        let ch = self
            .state
            .node()
            .network()
            .channel(&addr)
            .map_err(Status::internal)?;
        let mut fwd = GrpcRequest::new(msg);
        if let Some(v) = req.metadata().get("authorization") {
            fwd.metadata_mut().insert("authorization", v.clone());
        }
        fwd.set_timeout(std::time::Duration::from_secs(60));
        call(AdminClient::new(ch), fwd).await
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn join(
        &self,
        req: GrpcRequest<JoinRequest>,
    ) -> Result<GrpcResponse<AdminReply>, Status> {
        self.auth(&req)?;
        let j = req.into_inner();
        let url = normalize_url(&j.url).map_err(Status::invalid_argument)?;
        self.apply(Command::JoinServer {
            url,
            ranks: j.ranks.max(1),
            capacity_tokens: if j.capacity_tokens == 0 {
                self.default_capacity
            } else {
                j.capacity_tokens
            },
            weight: if j.weight == 0.0 { 1.0 } else { j.weight },
        })
        .await
    }

    async fn leave(
        &self,
        req: GrpcRequest<ServerRequest>,
    ) -> Result<GrpcResponse<AdminReply>, Status> {
        self.auth(&req)?;
        let url = normalize_url(&req.into_inner().url).map_err(Status::invalid_argument)?;
        self.apply(Command::LeaveServer { url }).await
    }

    async fn drain(
        &self,
        req: GrpcRequest<DrainRequest>,
    ) -> Result<GrpcResponse<AdminReply>, Status> {
        self.auth(&req)?;
        let d = req.into_inner();
        let url = normalize_url(&d.url).map_err(Status::invalid_argument)?;
        self.apply(Command::DrainServer {
            url,
            draining: d.draining,
        })
        .await
    }

    async fn servers(&self, req: GrpcRequest<Empty>) -> Result<GrpcResponse<ServersReply>, Status> {
        self.auth(&req)?;
        Ok(GrpcResponse::new(ServersReply {
            servers: server_infos(&self.state.topology()),
        }))
    }

    async fn add_peer(
        &self,
        req: GrpcRequest<AddPeerRequest>,
    ) -> Result<GrpcResponse<AdminReply>, Status> {
        self.auth(&req)?;
        let p = req.get_ref().clone();
        if p.node_id == 0 || p.addr.is_empty() {
            return Err(Status::invalid_argument(
                "need a node id > 0 and an address",
            ));
        }
        match self.state.node().add_peer(p.node_id, &p.addr).await {
            Ok(()) => Ok(GrpcResponse::new(AdminReply {
                ok: true,
                message: format!("node {} at {} is a voter", p.node_id, p.addr),
                ranks: Vec::new(),
            })),
            Err(MembershipError::NotLeader(addr)) => {
                self.on_leader(&req, addr, p, |mut c, r| async move { c.add_peer(r).await })
                    .await
            }
            Err(MembershipError::Failed(m)) => Err(Status::failed_precondition(m)),
        }
    }

    async fn remove_peer(
        &self,
        req: GrpcRequest<RemovePeerRequest>,
    ) -> Result<GrpcResponse<AdminReply>, Status> {
        self.auth(&req)?;
        let p = *req.get_ref();
        match self.state.node().remove_peer(p.node_id).await {
            Ok(()) => Ok(GrpcResponse::new(AdminReply {
                ok: true,
                message: format!("node {} removed; its id is retired", p.node_id),
                ranks: Vec::new(),
            })),
            Err(MembershipError::NotLeader(addr)) => {
                self.on_leader(
                    &req,
                    addr,
                    p,
                    |mut c, r| async move { c.remove_peer(r).await },
                )
                .await
            }
            Err(MembershipError::Failed(m)) => Err(Status::failed_precondition(m)),
        }
    }

    async fn status(&self, req: GrpcRequest<Empty>) -> Result<GrpcResponse<StatusReply>, Status> {
        self.auth(&req)?;
        let node = self.state.node();
        let (applied, digest) = node.applied_digest().await;
        let m = node.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let matched = |id: u64| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map_or(0, |l| l.index)
        };
        let peers = membership
            .nodes()
            .map(|(id, n)| PeerInfo {
                node_id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
                matched_index: matched(*id),
            })
            .collect();
        Ok(GrpcResponse::new(StatusReply {
            node_id: node.id,
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            commit_index: node.stats.committed.load(Relaxed),
            applied_index: applied,
            peers,
            servers: server_infos(&self.state.topology()),
            map_entries: self.state.index_stats().entries,
            state_digest: digest,
            last_log_index: m.last_log_index.unwrap_or(0),
            role: format!("{:?}", m.state),
            snapshot_index: m.snapshot.map_or(0, |s| s.index),
            purged_index: m.purged.map_or(0, |s| s.index),
        }))
    }
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

fn authorize_admin(ctx: &Ctx, h: &HeaderMap) -> Result<(), ApiError> {
    let presented = bearer(h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
    match check_token(ctx.cfg.admin_token.as_deref(), presented) {
        Ok(()) => Ok(()),
        Err(Denied::Disabled) => Err(ApiError::admin_disabled()),
        Err(Denied::BadToken) => Err(ApiError::admin_unauthorized()),
    }
}

/// `/add_worker?url=`, `/remove_worker?url=` (POST) and `/list_workers` (GET), as
/// vllm-router serves them, with the admin token required.
pub async fn http(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    path: &str,
) -> Result<Response<RespBody>, ApiError> {
    authorize_admin(ctx, req.headers())?;
    let want = if path == "/list_workers" {
        Method::GET
    } else {
        Method::POST
    };
    if req.method() != want {
        return Err(ApiError::method_not_allowed(req.method(), path));
    }
    if path == "/list_workers" {
        let servers = server_infos(&ctx.state.topology());
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
    let raw = query_param(req.uri(), "url").ok_or_else(|| {
        ApiError::bad_request("missing_url", "pass the server as ?url=http://host:port")
    })?;
    let url = normalize_url(&raw).map_err(|e| ApiError::bad_request("invalid_url", e))?;
    let num = |k: &str| -> Result<Option<f64>, ApiError> {
        match query_param(req.uri(), k) {
            None => Ok(None),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_parameter",
                        format!("{k} must be a positive number"),
                    )
                }),
        }
    };
    let cmd = if path == "/add_worker" {
        Command::JoinServer {
            url: url.clone(),
            ranks: num("ranks")?.map_or(1, |v| v as u32),
            capacity_tokens: num("capacity_tokens")?
                .map_or(ctx.cfg.cache.default_capacity_tokens, |v| v as u64),
            weight: num("weight")?.unwrap_or(1.0),
        }
    } else {
        Command::LeaveServer { url: url.clone() }
    };
    let done = ctx
        .state
        .change(cmd)
        .await
        .map_err(ApiError::admin_unavailable)?;
    match done.outcome {
        Outcome::Rejected(m) => {
            let status = if m.starts_with("no server") {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::BAD_REQUEST
            };
            Err(ApiError::admin_rejected(status, m))
        }
        Outcome::Joined(ranks) => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok", "message": format!("added {url}: {}", done.note), "url": url, "ranks": ranks}),
        )),
        Outcome::Ok => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok", "message": format!("removed {url}: {}", done.note), "url": url}),
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

    #[test]
    fn tokens_are_checked() {
        assert!(matches!(
            check_token(None, Some("x")),
            Err(Denied::Disabled)
        ));
        assert!(matches!(
            check_token(Some("secret-token-123456"), None),
            Err(Denied::BadToken)
        ));
        assert!(matches!(
            check_token(Some("secret-token-123456"), Some("secret-token-12345")),
            Err(Denied::BadToken)
        ));
        assert!(check_token(Some("secret-token-123456"), Some("secret-token-123456")).is_ok());
    }
}
