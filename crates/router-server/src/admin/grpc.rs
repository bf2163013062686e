//! The admin gRPC service that `routerctl` talks to, on the peer port. Server changes go
//! through [`RoutingState::change`], so a change returns once every reachable peer routes
//! by it; peer membership changes run on the leader (a follower forwards them there).

use super::auth::{bearer, check_token};
use super::error::AdminError;
use super::self_check::not_this_router;
use super::servers::server_infos;
use crate::client::UpstreamClient;
use crate::config::Config;
use crate::identity::RouterId;
use crate::state::{Changed, ClusterState, RoutingState};
use router_cluster::node::CATCH_UP_TIMEOUT;
use router_cluster::MembershipError;
use router_core::{parse_upstream_url, Command, Outcome, UpstreamUrl};
use router_proto::v1::admin_client::AdminClient;
use router_proto::v1::admin_server::Admin;
use router_proto::v1::{
    AddPeerRequest, AdminReply, DrainRequest, Empty, ExplainReply, ExplainRequest, JoinRequest,
    PeerInfo, PeerStatusRequest, RankTop, ReasonCount, RemovePeerRequest, ServerRequest,
    ServersReply, StatusReply, TopReply,
};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// Longest catch-up a caller may ask for.
const MAX_CATCH_UP: Duration = Duration::from_secs(600);
/// How long a call forwarded to the leader may take (a peer add waits for catch-up).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(630);
/// How long a relayed status call may take: a peer that does not answer by then is
/// reported unreachable.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// The admin gRPC service.
pub struct AdminService {
    state: Arc<ClusterState>,
    cfg: Arc<Config>,
    token: Option<String>,
    default_capacity: u64,
    client: UpstreamClient,
    id: RouterId,
}

fn reply(message: String, ranks: Vec<u32>) -> Response<AdminReply> {
    Response::new(AdminReply {
        ok: true,
        message,
        ranks,
        ..Default::default()
    })
}

/// The normalized URL, or why it is not a server URL.
fn server_url(url: &str) -> Result<String, AdminError> {
    parsed_url(url).map(|u| u.url)
}

fn parsed_url(url: &str) -> Result<UpstreamUrl, AdminError> {
    parse_upstream_url(url).map_err(|e| AdminError::InvalidUrl(format!("'{}': {e}", url.trim())))
}

impl AdminService {
    /// Serves `state`; `token` unset refuses every call. `client` and `id` let a join
    /// refuse a URL that is this router.
    pub fn new(
        state: Arc<ClusterState>,
        cfg: Arc<Config>,
        token: Option<String>,
        default_capacity: u64,
        client: UpstreamClient,
        id: RouterId,
    ) -> Self {
        AdminService {
            state,
            cfg,
            token,
            default_capacity,
            client,
            id,
        }
    }

    fn auth<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let presented = bearer(
            req.metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
        );
        check_token(self.token.as_deref(), presented).map_err(|d| Status::from(AdminError::from(d)))
    }

    async fn apply(&self, cmd: Command) -> Result<Response<AdminReply>, Status> {
        let done: Changed = self.state.change(cmd).await.map_err(AdminError::from)?;
        let ranks = match &done.outcome {
            Outcome::Rejected(r) => return Err(AdminError::Rejected(r.clone()).into()),
            Outcome::Joined(ranks) => ranks.clone(),
            Outcome::Ok => Vec::new(),
        };
        Ok(Response::new(AdminReply {
            ok: true,
            message: done.note(),
            ranks,
            log_index: done.index.unwrap_or(0),
            confirmed_peers: done.confirmed,
            unconfirmed_peers: done.unconfirmed,
        }))
    }

    /// An admin client to another peer over the peer network's cached channel.
    fn admin_client(&self, addr: &str) -> Result<AdminClient<tonic::transport::Channel>, Status> {
        let ch = self
            .state
            .node()
            .network()
            .channel(addr)
            .map_err(Status::internal)?;
        Ok(AdminClient::new(ch))
    }

    /// Membership changes happen on the leader: forward there with the caller's token.
    async fn on_leader<T, F, Fut>(
        &self,
        req: &Request<T>,
        addr: Option<String>,
        msg: T,
        call: F,
    ) -> Result<Response<AdminReply>, Status>
    where
        F: FnOnce(AdminClient<tonic::transport::Channel>, Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<AdminReply>, Status>>,
    {
        let addr = addr.ok_or_else(|| Status::unavailable("no leader at the moment; retry"))?;
        let client = self.admin_client(&addr)?;
        let mut fwd = forwarded(req, msg);
        fwd.set_timeout(FORWARD_TIMEOUT);
        // Bounded here as well: a paused leader takes the connection and never answers.
        tokio::time::timeout(FORWARD_TIMEOUT, call(client, fwd))
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "the leader at {addr} did not answer within {FORWARD_TIMEOUT:?}; the change \
                     may still apply: check with `routerctl status`"
                ))
            })?
    }
}

/// How long a membership change waits for a leader it can reach (an election, a leader
/// that went away and whose name no longer resolves).
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// Whether a forward to the leader failed before it was sent: no leader known yet, or a
/// connection that was never made (the name does not resolve, refused, no route). Only
/// then is the change certainly not made and asking the next leader safe.
fn never_sent(s: &Status) -> bool {
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut text = s.message().to_ascii_lowercase();
    let mut e: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(err) = e {
        text.push(' ');
        text.push_str(&err.to_string().to_ascii_lowercase());
        e = err.source();
    }
    [
        "no leader at the moment",
        "dns error",
        "connection refused",
        "no route to host",
    ]
    .iter()
    .any(|k| text.contains(k))
}

/// Runs a membership change (here when this peer leads, else forwarded) again while the
/// forward certainly never left, for up to [`LEADER_WAIT`].
async fn until_sent<F, Fut>(mut attempt: F) -> Result<Response<AdminReply>, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Response<AdminReply>, Status>>,
{
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    loop {
        match attempt().await {
            Err(s) if never_sent(&s) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => return r,
        }
    }
}

/// `msg` with the caller's token, to send on to another peer.
fn forwarded<T, U>(req: &Request<T>, msg: U) -> Request<U> {
    let mut fwd = Request::new(msg);
    if let Some(v) = req.metadata().get("authorization") {
        fwd.metadata_mut().insert("authorization", v.clone());
    }
    fwd
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn join(&self, req: Request<JoinRequest>) -> Result<Response<AdminReply>, Status> {
        self.auth(&req)?;
        let j = req.into_inner();
        let u = parsed_url(&j.url)?;
        not_this_router(&self.client, &self.id, &u.url, &u.authority).await?;
        self.apply(Command::JoinServer {
            url: u.url,
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

    async fn leave(&self, req: Request<ServerRequest>) -> Result<Response<AdminReply>, Status> {
        self.auth(&req)?;
        let url = server_url(&req.into_inner().url)?;
        self.apply(Command::LeaveServer { url }).await
    }

    async fn drain(&self, req: Request<DrainRequest>) -> Result<Response<AdminReply>, Status> {
        self.auth(&req)?;
        let d = req.into_inner();
        let url = server_url(&d.url)?;
        self.apply(Command::DrainServer {
            url,
            draining: d.draining,
        })
        .await
    }

    async fn servers(&self, req: Request<Empty>) -> Result<Response<ServersReply>, Status> {
        self.auth(&req)?;
        Ok(Response::new(ServersReply {
            servers: server_infos(&self.state.topology()),
        }))
    }

    async fn add_peer(&self, req: Request<AddPeerRequest>) -> Result<Response<AdminReply>, Status> {
        self.auth(&req)?;
        let p = req.get_ref().clone();
        if p.node_id == 0 || p.addr.is_empty() {
            return Err(
                AdminError::InvalidRequest("need a node id > 0 and an address".into()).into(),
            );
        }
        let wait = match p.catch_up_timeout_ms {
            0 => CATCH_UP_TIMEOUT,
            ms => Duration::from_millis(ms).min(MAX_CATCH_UP),
        };
        let (req, p) = (&req, &p);
        until_sent(|| async move {
            match self
                .state
                .node()
                .add_peer_within(p.node_id, &p.addr, wait)
                .await
            {
                Ok(()) => Ok(reply(
                    format!("node {} at {} caught up and is a voter", p.node_id, p.addr),
                    Vec::new(),
                )),
                Err(MembershipError::NotLeader(addr)) => {
                    let p = p.clone();
                    self.on_leader(req, addr, p, |mut c, r| async move { c.add_peer(r).await })
                        .await
                }
                Err(e) => Err(AdminError::Membership(e).into()),
            }
        })
        .await
    }

    async fn remove_peer(
        &self,
        req: Request<RemovePeerRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        self.auth(&req)?;
        let p = *req.get_ref();
        let req = &req;
        until_sent(|| async move {
            match self.state.node().remove_peer(p.node_id).await {
                Ok(()) => Ok(reply(
                    format!("node {} removed; its id is retired", p.node_id),
                    Vec::new(),
                )),
                Err(MembershipError::NotLeader(addr)) => {
                    self.on_leader(
                        req,
                        addr,
                        p,
                        |mut c, r| async move { c.remove_peer(r).await },
                    )
                    .await
                }
                Err(e) => Err(AdminError::Membership(e).into()),
            }
        })
        .await
    }

    async fn peer_status(
        &self,
        req: Request<PeerStatusRequest>,
    ) -> Result<Response<StatusReply>, Status> {
        self.auth(&req)?;
        let id = req.get_ref().node_id;
        let me = self.state.node().status();
        if id == me.id {
            return self.status(forwarded(&req, Empty {})).await;
        }
        let addr = me
            .members
            .into_iter()
            .find(|m| m.id == id)
            .map(|m| m.addr)
            .ok_or_else(|| Status::not_found(format!("node {id} is not a peer of this cluster")))?;
        let mut client = self.admin_client(&addr)?;
        let mut fwd = forwarded(&req, Empty {});
        fwd.set_timeout(PEER_STATUS_TIMEOUT);
        match tokio::time::timeout(PEER_STATUS_TIMEOUT, client.status(fwd)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(s)) if s.code() == tonic::Code::Unavailable => Err(Status::unavailable(
                format!("cannot reach node {id} at {addr}: {}", s.message()),
            )),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(Status::unavailable(format!(
                "node {id} at {addr} did not answer within {PEER_STATUS_TIMEOUT:?}"
            ))),
        }
    }

    async fn explain(
        &self,
        req: Request<ExplainRequest>,
    ) -> Result<Response<ExplainReply>, Status> {
        self.auth(&req)?;
        let r = req.into_inner();
        let ep = super::explain::endpoint_named(&r.endpoint)?;
        let sid = (!r.session_id.is_empty()).then_some(r.session_id.as_str());
        let v = super::explain::decision(&*self.state, &self.cfg, ep, &r.body, sid)?;
        Ok(Response::new(ExplainReply {
            json: v.to_string(),
        }))
    }

    async fn top(&self, req: Request<Empty>) -> Result<Response<TopReply>, Status> {
        self.auth(&req)?;
        let topo = self.state.topology();
        let mut ranks: Vec<RankTop> = topo
            .ranks
            .iter()
            .map(|r| RankTop {
                label: r.label.to_string(),
                url: r.upstream.url.to_string(),
                rank_id: r.id,
                up: r.upstream.up.load(Relaxed),
                draining: !r.upstream.accepting.load(Relaxed),
                inflight: r.inflight.load(Relaxed),
                queued_prefill_tokens: r.queued_prefill.load(Relaxed),
                decodes: r.decodes.load(Relaxed),
                requests: r.requests.load(Relaxed),
                prompt_tokens: r.usage_prompt_tokens.load(Relaxed),
                cached_tokens: r.usage_cached_tokens.load(Relaxed),
                model_tokens: 0,
                capacity_tokens: r.capacity(),
            })
            .collect();
        drop(topo);
        let ids: Vec<u32> = ranks.iter().map(|r| r.rank_id).collect();
        for (r, t) in ranks
            .iter_mut()
            .zip(self.state.node().rank_tokens(&ids).await)
        {
            r.model_tokens = t;
        }
        Ok(Response::new(TopReply {
            node_id: self.state.node().id,
            ranks,
            decisions: self
                .state
                .metrics()
                .decision_counts()
                .into_iter()
                .map(|(reason, decisions)| ReasonCount {
                    reason: reason.to_owned(),
                    decisions,
                })
                .collect(),
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }))
    }

    async fn status(&self, req: Request<Empty>) -> Result<Response<StatusReply>, Status> {
        self.auth(&req)?;
        let v = self.state.status().await;
        let n = &v.node;
        Ok(Response::new(StatusReply {
            node_id: n.id,
            leader: n.leader.unwrap_or(0),
            term: n.term,
            commit_index: n.commit_index,
            applied_index: v.applied_index,
            peers: n
                .members
                .iter()
                .map(|m| PeerInfo {
                    node_id: m.id,
                    addr: m.addr.clone(),
                    voter: m.voter,
                    matched_index: m.matched_index.unwrap_or(0),
                })
                .collect(),
            servers: server_infos(&self.state.topology()),
            map_entries: self.state.index_stats().entries,
            state_digest: v.digest,
            last_log_index: n.last_log_index,
            role: n.role.as_str().to_owned(),
            snapshot_index: n.snapshot_index,
            purged_index: n.purged_index,
        }))
    }
}
