//! One cluster peer: sled storage, openraft, the peer gRPC service, and writes that a
//! follower forwards to the leader itself.

use crate::network::{Network, PeerService};
use crate::store::{LogStore, Node, NodeId, OnApply, StateMachineStore, StoreStats, TypeConfig};
use crate::tls::PeerTls;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config, Raft};
use router_core::{Command, Outcome};
use router_proto::v1::peer_client::PeerClient;
use router_proto::v1::peer_server::PeerServer;
use router_proto::v1::RaftMessage;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::service::Routes;
use tonic::transport::ServerTlsConfig;

/// Settings of one peer.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Node id (never reused).
    pub id: NodeId,
    /// Peer gRPC address.
    pub listen: SocketAddr,
    /// sled directory.
    pub data_dir: PathBuf,
    /// Shared by every peer of the cluster; others are refused.
    pub cluster_id: String,
    /// Raft heartbeat, ms.
    pub heartbeat_ms: u64,
    /// Election timeout range, ms.
    pub election_min_ms: u64,
    /// Election timeout range, ms.
    pub election_max_ms: u64,
    /// Snapshot after this many applied entries.
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot.
    pub keep_logs: u64,
    /// Mutual TLS between peers (and TLS for admin clients).
    pub tls: Option<PeerTls>,
    /// Cache model sizing.
    pub max_entries: u64,
    /// Session hints kept.
    pub max_sessions: u64,
}

/// A running peer.
pub struct ClusterNode {
    /// The Raft handle.
    pub raft: Raft<TypeConfig>,
    /// The state machine (read it for digests and status).
    pub sm: StateMachineStore,
    /// This peer's id.
    pub id: NodeId,
    /// Storage counters.
    pub stats: Arc<StoreStats>,
    cluster_id: String,
    net: Network,
    listen: SocketAddr,
    tls: Option<ServerTlsConfig>,
    server: Mutex<Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>>,
}

/// Why a membership change did not happen here.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// Only the leader changes membership; this is its address when known.
    #[error("not the leader")]
    NotLeader(Option<String>),
    /// Refused or failed.
    #[error("{0}")]
    Failed(String),
}

impl ClusterNode {
    /// Opens storage and starts Raft; nothing is served until [`ClusterNode::serve`].
    pub async fn open(cfg: NodeConfig, on_apply: Option<OnApply>) -> anyhow::Result<Arc<Self>> {
        let db = sled::open(&cfg.data_dir)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", cfg.data_dir.display()))?;
        let stats = Arc::new(StoreStats::default());
        let log = LogStore::open(&db, stats.clone())?;
        let sm = StateMachineStore::open(
            &db,
            cfg.max_entries,
            cfg.max_sessions,
            on_apply,
            stats.clone(),
        )
        .map_err(|e| anyhow::anyhow!("opening the state machine: {e}"))?;
        let raft_cfg = Config {
            cluster_name: cfg.cluster_id.clone(),
            heartbeat_interval: cfg.heartbeat_ms,
            election_timeout_min: cfg.election_min_ms,
            election_timeout_max: cfg.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
            max_in_snapshot_log_to_keep: cfg.keep_logs,
            install_snapshot_timeout: 2_000,
            // An append must finish within one heartbeat interval (openraft's timeout for
            // it); route batches are large, so send few entries per call.
            max_payload_entries: 8,
            ..Default::default()
        }
        .validate()?;
        let tls = cfg.tls.as_ref().map(PeerTls::load).transpose()?;
        let net = Network::new(&cfg.cluster_id, tls.as_ref().map(|t| t.client.clone()));
        let raft = Raft::new(cfg.id, Arc::new(raft_cfg), net.clone(), log, sm.clone())
            .await
            .map_err(|e| anyhow::anyhow!("starting raft: {e}"))?;
        Ok(Arc::new(ClusterNode {
            raft,
            sm,
            id: cfg.id,
            stats,
            cluster_id: cfg.cluster_id,
            net,
            listen: cfg.listen,
            tls: tls.map(|t| t.server),
            server: Mutex::new(None),
        }))
    }

    /// Binds the peer address and serves the peer service plus `extra` (the admin service).
    pub async fn serve(self: &Arc<Self>, extra: Option<Routes>) -> anyhow::Result<()> {
        let svc = PeerService::new(self.raft.clone(), &self.cluster_id, self.tls.is_some());
        let peer = PeerServer::new(svc)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        let routes = match extra {
            Some(r) => r.add_service(peer),
            None => Routes::new(peer),
        };
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", self.listen))?;
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut builder = tonic::transport::Server::builder()
            .timeout(Duration::from_secs(30))
            .concurrency_limit_per_connection(256);
        if let Some(t) = &self.tls {
            builder = builder.tls_config(t.clone())?;
        }
        let router = builder.add_routes(routes);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let res = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = res {
                tracing::error!(error = %e, "peer service stopped");
            }
        });
        *self.server.lock().unwrap_or_else(|e| e.into_inner()) = Some((stop, task));
        Ok(())
    }

    /// Opens and serves the peer service alone.
    pub async fn start(cfg: NodeConfig, on_apply: Option<OnApply>) -> anyhow::Result<Arc<Self>> {
        let node = Self::open(cfg, on_apply).await?;
        node.serve(None).await?;
        Ok(node)
    }

    /// The peer network (cached channels, TLS), for admin calls between peers.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The current leader's id and address, when known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id)?.addr.clone();
        Some((id, addr))
    }

    /// Adds a router peer: as a learner first (it catches up from the log or a snapshot),
    /// then as a voter. Retired ids are refused. Only on the leader.
    pub async fn add_peer(&self, id: NodeId, addr: &str) -> Result<(), MembershipError> {
        if self.sm.state.read().await.machine.is_retired(id) {
            return Err(MembershipError::Failed(format!(
                "node id {id} was removed before; ids are never reused"
            )));
        }
        let m = self.raft.metrics().borrow().clone();
        let mut voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        if voters.contains(&id) {
            return Err(MembershipError::Failed(format!(
                "node {id} is already a voter"
            )));
        }
        self.raft
            .add_learner(id, Node::new(addr), true)
            .await
            .map_err(membership_error)?;
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Removes a router peer from the voters and retires its id. Only on the leader.
    pub async fn remove_peer(&self, id: NodeId) -> Result<(), MembershipError> {
        let m = self.raft.metrics().borrow().clone();
        let mut voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        let learner = m.membership_config.membership().get_node(&id).is_some();
        if !voters.remove(&id) && !learner {
            return Err(MembershipError::Failed(format!(
                "node {id} is not a member"
            )));
        }
        if voters.is_empty() {
            return Err(MembershipError::Failed(
                "cannot remove the last voter".to_string(),
            ));
        }
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(membership_error)?;
        self.propose(Command::RetirePeer { id })
            .await
            .map_err(|e| MembershipError::Failed(e.to_string()))?;
        Ok(())
    }

    /// Makes the first membership (call on one peer of a new cluster).
    pub async fn initialize(&self, members: BTreeMap<NodeId, Node>) -> anyhow::Result<()> {
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("initialize: {e}")),
        }
    }

    /// Proposes a command: locally when leader, else forwarded to the leader by this peer.
    /// While no leader is known (an election is under way) it waits, up to about 3 s.
    pub async fn propose(&self, cmd: Command) -> anyhow::Result<Outcome> {
        Ok(self.propose_at(cmd).await?.1)
    }

    /// Like [`ClusterNode::propose`], also returning the entry's log index.
    pub async fn propose_at(&self, cmd: Command) -> anyhow::Result<(u64, Outcome)> {
        let mut waited = Duration::ZERO;
        loop {
            match self.raft.client_write(cmd.clone()).await {
                Ok(r) => return Ok((r.log_id.index, r.data)),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    match f.leader_node {
                        Some(node) => return self.forward(&node.addr, &cmd).await,
                        None if waited < Duration::from_secs(3) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            waited += Duration::from_millis(50);
                        }
                        None => anyhow::bail!("no leader"),
                    }
                }
                Err(e) => return Err(anyhow::anyhow!("propose: {e}")),
            }
        }
    }

    async fn forward(&self, addr: &str, cmd: &Command) -> anyhow::Result<(u64, Outcome)> {
        let ch = self.net.channel(addr).map_err(|e| anyhow::anyhow!(e))?;
        let mut req = tonic::Request::new(RaftMessage {
            cluster_id: self.cluster_id.clone(),
            payload: crate::codec::encode(cmd)?,
            error: String::new(),
        });
        req.set_timeout(Duration::from_secs(5));
        let reply = PeerClient::new(ch).forward(req).await?.into_inner();
        if !reply.error.is_empty() {
            anyhow::bail!("leader refused: {}", reply.error);
        }
        Ok(crate::codec::decode(&reply.payload)?)
    }

    /// Waits until every member (voters and learners) has applied `index`, or `timeout`.
    /// Returns the members that confirmed and those that did not (unreachable or behind).
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> (Vec<NodeId>, Vec<NodeId>) {
        let deadline = tokio::time::Instant::now() + timeout;
        let members: Vec<(NodeId, String)> = {
            let m = self.raft.metrics().borrow().clone();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        };
        let mut done = Vec::new();
        let mut pending = members;
        loop {
            let mut still = Vec::new();
            for (id, addr) in pending {
                let applied = if id == self.id {
                    Some(
                        self.raft
                            .metrics()
                            .borrow()
                            .last_applied
                            .map_or(0, |l| l.index),
                    )
                } else {
                    self.remote_applied(&addr).await
                };
                if applied.is_some_and(|a| a >= index) {
                    done.push(id);
                } else {
                    still.push((id, addr));
                }
            }
            pending = still;
            if pending.is_empty() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        done.sort_unstable();
        (done, pending.into_iter().map(|p| p.0).collect())
    }

    async fn remote_applied(&self, addr: &str) -> Option<u64> {
        let ch = self.net.channel(addr).ok()?;
        let mut req = tonic::Request::new(RaftMessage {
            cluster_id: self.cluster_id.clone(),
            payload: Vec::new(),
            error: String::new(),
        });
        req.set_timeout(Duration::from_millis(500));
        let reply = PeerClient::new(ch).applied(req).await.ok()?.into_inner();
        crate::codec::decode(&reply.payload).ok()
    }

    /// Last applied log index and the digest of the state at that index, read together.
    /// Walks the whole state: for status calls, not for anything per request.
    pub async fn applied_digest(&self) -> (u64, u64) {
        let st = self.sm.state.read().await;
        (st.last_applied.map_or(0, |l| l.index), st.machine.digest())
    }

    /// Digest of the applied state.
    pub async fn digest(&self) -> u64 {
        self.sm.state.read().await.machine.digest()
    }

    /// Last applied log index.
    pub async fn applied(&self) -> u64 {
        self.sm
            .state
            .read()
            .await
            .last_applied
            .map_or(0, |l| l.index)
    }

    /// Stops serving and shuts Raft down.
    pub async fn shutdown(&self) {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _ = self.raft.shutdown().await;
        if let Some((stop, task)) = server {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            MembershipError::NotLeader(f.leader_node.map(|n| n.addr))
        }
        e => MembershipError::Failed(e.to_string()),
    }
}
