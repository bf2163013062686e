//! Raft RPCs over tonic: one cached channel per peer, a timeout per call, and the cluster id
//! on every message so that a peer of another cluster is refused.

use crate::store::{Node, NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::Raft;
use router_proto::v1::peer_client::PeerClient;
use router_proto::v1::peer_server::Peer;
use router_proto::v1::RaftMessage;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status};

/// HTTP/2 ping interval and timeout on peer connections.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// Builds clients to peers, caching one channel per peer address.
#[derive(Clone)]
pub struct Network {
    cluster_id: Arc<str>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    connect_timeout: Duration,
    tls: Option<ClientTlsConfig>,
}

impl Network {
    /// A factory for the cluster `cluster_id`; with `tls`, every peer is reached over
    /// mutual TLS.
    pub fn new(cluster_id: &str, tls: Option<ClientTlsConfig>) -> Network {
        Network {
            cluster_id: Arc::from(cluster_id),
            channels: Arc::new(Mutex::new(HashMap::new())),
            connect_timeout: Duration::from_millis(500),
            tls,
        }
    }

    /// The cached channel to `addr` (created lazily on first use).
    pub fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut map = self
            .channels
            .lock()
            .map_err(|_| "channel cache poisoned".to_string())?;
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let ch = endpoint(addr, self.tls.as_ref())?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            // A connection that went silent (a partition, a paused or killed peer) is
            // found dead within seconds and replaced by a new one: otherwise calls keep
            // queueing on it behind TCP's retransmission backoff after the network heals,
            // and a deposed leader went on believing it led for seconds.
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
            // Lazy: connects on first use and reconnects (with backoff) after failures.
            .connect_lazy();
        map.insert(addr.to_owned(), ch.clone());
        Ok(ch)
    }
}

/// An endpoint for `addr` (`host:port`), over TLS when `tls` is given.
pub fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let e = Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| e.to_string())?;
    match tls {
        Some(t) => e.tls_config(t.clone()).map_err(|e| e.to_string()),
        None => Ok(e),
    }
}

/// A client to one peer.
pub struct PeerConn {
    target: NodeId,
    addr: String,
    net: Network,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerConn {
        PeerConn {
            target,
            addr: node.addr.clone(),
            net: self.clone(),
        }
    }
}

#[derive(Debug)]
struct Msg(String);
impl std::fmt::Display for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Msg {}

impl PeerConn {
    async fn call<Req, Resp, E>(
        &self,
        kind: &'static str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload =
            crate::codec::encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let ch = self
            .net
            .channel(&self.addr)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&Msg(e))))?;
        let mut client = PeerClient::new(ch)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        let mut r = Request::new(RaftMessage {
            cluster_id: self.net.cluster_id.to_string(),
            payload,
            error: String::new(),
        });
        r.set_timeout(option.hard_ttl());
        let reply = match kind {
            "vote" => client.vote(r).await,
            "append" => client.append_entries(r).await,
            _ => client.install_snapshot(r).await,
        };
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&Msg(s
                    .message()
                    .to_owned()))))
            }
            Err(s) => {
                return Err(RPCError::Network(NetworkError::new(&Msg(format!(
                    "{}: {}",
                    s.code(),
                    s.message()
                )))))
            }
        };
        if !reply.error.is_empty() {
            return Err(RPCError::Network(NetworkError::new(&Msg(reply.error))));
        }
        let res: Result<Resp, E> = crate::codec::decode(&reply.payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call("append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call("snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call("vote", &rpc, &option).await
    }
}

/// The server side: hands each RPC to the local Raft after checking the cluster id.
pub struct PeerService {
    raft: Raft<TypeConfig>,
    cluster_id: Arc<str>,
    require_cert: bool,
    /// Until set, Raft calls are refused: a peer that started without state has not yet
    /// checked that it did not lose it (see `ClusterNode::check_not_lost`).
    ready: Arc<std::sync::atomic::AtomicBool>,
    sm: crate::store::StateMachineStore,
}

impl PeerService {
    /// Serves `raft` for cluster `cluster_id`. With `require_cert`, a caller must have
    /// presented a client certificate that the TLS layer verified against the cluster CA.
    /// Raft calls are served once `ready` is set; `sm` answers which peers acknowledged.
    pub fn new(
        raft: Raft<TypeConfig>,
        cluster_id: &str,
        require_cert: bool,
        ready: Arc<std::sync::atomic::AtomicBool>,
        sm: crate::store::StateMachineStore,
    ) -> PeerService {
        PeerService {
            raft,
            cluster_id: Arc::from(cluster_id),
            require_cert,
            ready,
            sm,
        }
    }

    fn check_ready(&self) -> Result<(), Status> {
        if self.ready.load(std::sync::atomic::Ordering::Acquire) {
            Ok(())
        } else {
            Err(Status::unavailable(
                "starting without Raft state: checking that it was not lost",
            ))
        }
    }

    fn check(&self, req: Request<RaftMessage>) -> Result<RaftMessage, Status> {
        if self.require_cert && req.peer_certs().is_none_or(|c| c.is_empty()) {
            return Err(Status::unauthenticated(
                "peer calls need a client certificate signed by the cluster CA",
            ));
        }
        let m = req.into_inner();
        if !router_core::ct_eq(m.cluster_id.as_bytes(), self.cluster_id.as_bytes()) {
            return Err(Status::permission_denied("wrong cluster id"));
        }
        Ok(m)
    }
}

fn decode<T: DeserializeOwned>(m: &RaftMessage) -> Result<T, Status> {
    crate::codec::decode(&m.payload)
        .map_err(|e| Status::invalid_argument(format!("bad payload: {e}")))
}

fn reply<T: Serialize>(v: &T) -> Result<Response<RaftMessage>, Status> {
    let payload = crate::codec::encode(v).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftMessage {
        cluster_id: String::new(),
        payload,
        error: String::new(),
    }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn vote(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_ready()?;
        let m = self.check(req)?;
        let r = self.raft.vote(decode(&m)?).await;
        reply(&r)
    }

    async fn append_entries(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_ready()?;
        let m = self.check(req)?;
        let r = self.raft.append_entries(decode(&m)?).await;
        reply(&r)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_ready()?;
        let m = self.check(req)?;
        let r = self.raft.install_snapshot(decode(&m)?).await;
        reply(&r)
    }

    async fn forward(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_ready()?;
        let m = self.check(req)?;
        let cmd: router_core::Command = decode(&m)?;
        match self.raft.client_write(cmd).await {
            Ok(r) => reply(&(r.log_id.index, r.data)),
            Err(e) => Ok(Response::new(RaftMessage {
                cluster_id: String::new(),
                payload: Vec::new(),
                error: e.to_string(),
            })),
        }
    }

    async fn acked(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check(req)?;
        let ids: Vec<NodeId> = self
            .sm
            .state
            .read()
            .await
            .machine
            .acked()
            .iter()
            .copied()
            .collect();
        reply(&ids)
    }

    async fn applied(&self, req: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check(req)?;
        let applied = self
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index);
        reply(&applied)
    }
}
