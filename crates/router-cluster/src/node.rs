//! One cluster peer: sled storage, openraft, the peer gRPC service, and writes that a
//! follower forwards to the leader itself.

use crate::network::{Network, PeerService};
use crate::store::{LogStore, Node, NodeId, OnApply, StateMachineStore, TypeConfig};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config, Raft};
use router_core::{Command, Outcome};
use router_proto::v1::peer_client::PeerClient;
use router_proto::v1::peer_server::PeerServer;
use router_proto::v1::RaftMessage;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

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
    cluster_id: String,
    net: Network,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl ClusterNode {
    /// Opens storage, starts Raft and serves the peer service.
    pub async fn start(cfg: NodeConfig, on_apply: Option<OnApply>) -> anyhow::Result<ClusterNode> {
        let db = sled::open(&cfg.data_dir)?;
        let log = LogStore::open(&db)?;
        let sm = StateMachineStore::open(&db, cfg.max_entries, cfg.max_sessions, on_apply)
            .map_err(|e| anyhow::anyhow!("opening the state machine: {e}"))?;
        let raft_cfg = Config {
            cluster_name: cfg.cluster_id.clone(),
            heartbeat_interval: cfg.heartbeat_ms,
            election_timeout_min: cfg.election_min_ms,
            election_timeout_max: cfg.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
            max_in_snapshot_log_to_keep: cfg.keep_logs,
            install_snapshot_timeout: 2_000,
            ..Default::default()
        }
        .validate()?;
        let net = Network::new(&cfg.cluster_id);
        let raft = Raft::new(cfg.id, Arc::new(raft_cfg), net.clone(), log, sm.clone())
            .await
            .map_err(|e| anyhow::anyhow!("starting raft: {e}"))?;
        let svc = PeerService::new(raft.clone(), &cfg.cluster_id);
        let (stop, stopped) = oneshot::channel::<()>();
        let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = tokio::spawn(async move {
            let res = tonic::transport::Server::builder()
                .add_service(
                    PeerServer::new(svc)
                        .max_decoding_message_size(256 << 20)
                        .max_encoding_message_size(256 << 20),
                )
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = res {
                tracing::error!(error = %e, "peer service stopped");
            }
        });
        Ok(ClusterNode {
            raft,
            sm,
            id: cfg.id,
            cluster_id: cfg.cluster_id,
            net,
            stop: Some(stop),
            server,
        })
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
        let mut waited = Duration::ZERO;
        loop {
            match self.raft.client_write(cmd.clone()).await {
                Ok(r) => return Ok(r.data),
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

    async fn forward(&self, addr: &str, cmd: &Command) -> anyhow::Result<Outcome> {
        let ch = self.net.channel(addr).map_err(|e| anyhow::anyhow!(e))?;
        let mut req = tonic::Request::new(RaftMessage {
            cluster_id: self.cluster_id.clone(),
            payload: serde_json::to_vec(cmd)?,
            error: String::new(),
        });
        req.set_timeout(Duration::from_secs(5));
        let reply = PeerClient::new(ch).forward(req).await?.into_inner();
        if !reply.error.is_empty() {
            anyhow::bail!("leader refused: {}", reply.error);
        }
        Ok(serde_json::from_slice(&reply.payload)?)
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
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = self.raft.shutdown().await;
        let _ = (&mut self.server).await;
    }
}
