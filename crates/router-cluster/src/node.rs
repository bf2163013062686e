//! One cluster peer: sled storage, openraft, the peer gRPC service, and writes that a
//! follower forwards to the leader itself.

use crate::config::RaftTunables;
use crate::network::{Network, PeerService};
use crate::status::{Member, NodeStatus, Role, SnapshotStats};
use crate::store::{LogStore, Node, NodeId, OnApply, StateMachineStore, StoreStats, TypeConfig};
use crate::tls::PeerTls;
use futures_util::future::join_all;
use openraft::error::{ClientWriteError, RaftError};
use openraft::Raft;
use openraft::{RaftMetrics, ServerState};
use router_core::{Command, Outcome};
use router_proto::v1::peer_client::PeerClient;
use router_proto::v1::peer_server::PeerServer;
use router_proto::v1::RaftMessage;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{self, Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::service::Routes;
use tonic::transport::{Channel, ServerTlsConfig};

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
    /// Raft timing and log retention.
    pub raft: RaftTunables,
    /// Mutual TLS between peers (and TLS for admin clients).
    pub tls: Option<PeerTls>,
    /// Cache model sizing.
    pub max_entries: u64,
    /// Session hints kept.
    pub max_sessions: u64,
    /// Starting without Raft state, serve no Raft call until [`ClusterNode::check_not_lost`]
    /// has run (the router sets it; embedders that form clusters by hand may not).
    pub guard_lost_data: bool,
}

/// A running peer.
pub struct ClusterNode {
    raft: Raft<TypeConfig>,
    /// The state machine (tests and benchmarks read it; the router reads published views).
    pub sm: StateMachineStore,
    /// This peer's id.
    pub id: NodeId,
    stats: Arc<StoreStats>,
    cluster_id: String,
    net: Network,
    listen: SocketAddr,
    tls: Option<ServerTlsConfig>,
    server: Mutex<Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>>,
    /// Started without any Raft state.
    fresh: bool,
    /// Raft calls are served (see [`ClusterNode::check_not_lost`]).
    ready: Arc<AtomicBool>,
    data_dir: PathBuf,
}

/// How long a write waits for a reachable leader (an election takes well under a second).
pub const PROPOSE_WAIT: Duration = Duration::from_secs(5);

/// Longest wait for one answer when this peer asks another (applied index, acks). The
/// request's grpc-timeout is only a header for the server: a paused peer accepts the
/// connection and never answers, so the caller bounds the call itself, and asks all peers
/// at once so one silent peer costs this once, not once per peer.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a forwarded write failed.
enum Forward {
    /// The connection to the leader could not be made: the write was never delivered.
    NotSent(anyhow::Error),
    /// Anything else: it may or may not have been applied.
    Failed(anyhow::Error),
}

/// Whether a call failed before any connection existed (refused, unreachable, connect
/// timeout), so its request cannot have reached the other side.
fn never_connected(s: &tonic::Status) -> bool {
    if s.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut e: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(err) = e {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            );
        }
        e = err.source();
    }
    false
}

/// How long a new peer may take to catch up before `add_peer` gives up on it.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);
/// A learner within this many entries of the leader's log counts as caught up.
const CATCH_UP_LAG: u64 = 64;

/// Why a membership change did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// Only the leader changes membership; this is its address when known.
    #[error("not the leader")]
    NotLeader(Option<String>),
    /// The id belonged to a peer that was removed; ids are never reused.
    #[error("node id {0} was removed before; ids are never reused")]
    RetiredId(NodeId),
    /// Adding a peer that already votes.
    #[error("node {0} is already a voter")]
    AlreadyVoter(NodeId),
    /// Removing a peer that is not in the membership.
    #[error("node {0} is not a member")]
    NotMember(NodeId),
    /// Removing the only voter.
    #[error("cannot remove the last voter")]
    LastVoter,
    /// The new peer did not catch up in time: it was taken out again and never voted.
    #[error(
        "node {id} at {addr} did not catch up within {secs} s (it holds log index {matched:?}, \
         the leader {target}); it was removed again and never voted: check that it runs and \
         that this address reaches it, then retry"
    )]
    CatchUpTimeout {
        /// The new peer.
        id: NodeId,
        /// Its address.
        addr: String,
        /// Seconds waited.
        secs: u64,
        /// What it had replicated.
        matched: Option<u64>,
        /// The leader's last log index.
        target: u64,
    },
    /// Raft refused or failed the change (lost leadership, a change in progress, ...).
    #[error("{0}")]
    Raft(String),
}

impl ClusterNode {
    /// Opens storage and starts Raft; nothing is served until [`ClusterNode::serve`].
    pub async fn open(cfg: NodeConfig, on_apply: Option<OnApply>) -> anyhow::Result<Arc<Self>> {
        let db = sled::open(&cfg.data_dir)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", cfg.data_dir.display()))?;
        let stats = Arc::new(StoreStats::default());
        let mut log = LogStore::open(&db, stats.clone())?;
        // No vote and no log (not even a purged one behind a snapshot): a new peer, or one
        // whose data is gone. Read from storage: Raft's metrics are filled in only later.
        let fresh = {
            use openraft::storage::RaftLogStorage;
            let st = log
                .get_log_state()
                .await
                .map_err(|e| anyhow::anyhow!("reading the log: {e}"))?;
            let vote = log
                .read_vote()
                .await
                .map_err(|e| anyhow::anyhow!("reading the vote: {e}"))?;
            vote.is_none() && st.last_log_id.is_none() && st.last_purged_log_id.is_none()
        };
        let sm = StateMachineStore::open(
            &db,
            &cfg.data_dir,
            cfg.max_entries,
            cfg.max_sessions,
            on_apply,
            stats.clone(),
        )
        .map_err(|e| anyhow::anyhow!("opening the state machine: {e}"))?;
        let raft_cfg = cfg.raft.openraft(&cfg.cluster_id)?;
        let tls = cfg.tls.as_ref().map(PeerTls::load).transpose()?;
        let net = Network::new(&cfg.cluster_id, tls.as_ref().map(|t| t.client.clone()));
        let raft = Raft::new(cfg.id, Arc::new(raft_cfg), net.clone(), log, sm.clone())
            .await
            .map_err(|e| anyhow::anyhow!("starting raft: {e}"))?;
        // A fresh peer serves no Raft call until `check_not_lost` has told new from lost.
        Ok(Arc::new(ClusterNode {
            fresh,
            ready: Arc::new(AtomicBool::new(!(fresh && cfg.guard_lost_data))),
            data_dir: cfg.data_dir.clone(),
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
        let svc = PeerService::new(
            self.raft.clone(),
            &self.cluster_id,
            self.tls.is_some(),
            self.ready.clone(),
            self.sm.clone(),
        );
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

    fn metrics(&self) -> RaftMetrics<NodeId, Node> {
        self.raft.metrics().borrow().clone()
    }

    /// The current leader's id and address, when known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.metrics();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id)?.addr.clone();
        Some((id, addr))
    }

    /// Whether this peer knows a leader (its writes can go somewhere).
    pub fn has_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader.is_some()
    }

    /// Role, term, log positions and membership, read from Raft's metrics without a lock.
    pub fn status(&self) -> NodeStatus {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let matched = |id: NodeId| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|l| l.index)
        };
        NodeStatus {
            id: self.id,
            role: match m.state {
                ServerState::Leader => Role::Leader,
                ServerState::Follower => Role::Follower,
                ServerState::Candidate => Role::Candidate,
                ServerState::Learner => Role::Learner,
                ServerState::Shutdown => Role::Shutdown,
            },
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            // The committed index is learned from the leader; until then (a restart) what
            // this peer applied is committed too.
            commit_index: self
                .stats
                .committed
                .load(Relaxed)
                .max(m.last_applied.map_or(0, |l| l.index)),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |s| s.index),
            purged_index: m.purged.map_or(0, |s| s.index),
            members: membership
                .nodes()
                .map(|(id, n)| Member {
                    id: *id,
                    addr: n.addr.clone(),
                    voter: voters.contains(id),
                    matched_index: matched(*id),
                })
                .collect(),
        }
    }

    /// Snapshot counters and timings.
    pub fn snapshot_stats(&self) -> SnapshotStats {
        let s = &self.stats;
        SnapshotStats {
            built: s.snapshots_built.load(Relaxed),
            installed: s.snapshots_installed.load(Relaxed),
            bytes: s.snapshot_bytes.load(Relaxed),
            build_us: s.snapshot_build_us.load(Relaxed),
            lock_us: s.snapshot_lock_us.load(Relaxed),
            install_us: s.snapshot_install_us.load(Relaxed),
        }
    }

    /// Adds a router peer: as a learner first, then, once it has caught up with the log
    /// (within [`CATCH_UP_TIMEOUT`]), as a voter. A peer that does not catch up (down,
    /// unreachable, wrong address) is taken out again and never votes, so it can never cost
    /// the cluster its quorum. Retired ids are refused. Only on the leader.
    pub async fn add_peer(&self, id: NodeId, addr: &str) -> Result<(), MembershipError> {
        self.add_peer_within(id, addr, CATCH_UP_TIMEOUT).await
    }

    /// [`ClusterNode::add_peer`] with its own catch-up deadline.
    pub async fn add_peer_within(
        &self,
        id: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<(), MembershipError> {
        if self.sm.state.read().await.machine.is_retired(id) {
            return Err(MembershipError::RetiredId(id));
        }
        if self
            .metrics()
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == id)
        {
            return Err(MembershipError::AlreadyVoter(id));
        }
        self.raft
            .add_learner(id, Node::new(addr), false)
            .await
            .map_err(membership_error)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.raft.metrics();
        let caught_up = loop {
            let (matched, target, leading) = {
                let m = rx.borrow_and_update();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map(|l| l.index);
                (
                    matched,
                    m.last_log_index.unwrap_or(0),
                    m.state == ServerState::Leader,
                )
            };
            if !leading {
                break Err(MembershipError::Raft(
                    "lost leadership while the new peer caught up; retry".into(),
                ));
            }
            if matched.is_some_and(|i| i + CATCH_UP_LAG >= target) {
                break Ok(());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break Err(MembershipError::CatchUpTimeout {
                    id,
                    addr: addr.to_owned(),
                    secs: timeout.as_secs(),
                    matched,
                    target,
                });
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), rx.changed()).await;
        };
        if let Err(e) = caught_up {
            // Out again, so the leader stops replicating to it and admin changes do not
            // wait for it; it never voted, so quorum was never at stake.
            let gone: BTreeSet<NodeId> = [id].into();
            if let Err(r) = self
                .raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(gone), false)
                .await
            {
                tracing::warn!(node = id, error = %r, "could not remove the learner that did not catch up");
            }
            return Err(e);
        }
        let mut voters: BTreeSet<NodeId> = self
            .metrics()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Removes a router peer from the voters and retires its id. Only on the leader.
    pub async fn remove_peer(&self, id: NodeId) -> Result<(), MembershipError> {
        let m = self.metrics();
        let mut voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        let member = m.membership_config.membership().get_node(&id).is_some();
        if !member {
            return Err(MembershipError::NotMember(id));
        }
        if voters.remove(&id) {
            if voters.is_empty() {
                return Err(MembershipError::LastVoter);
            }
            self.raft
                .change_membership(voters, false)
                .await
                .map_err(membership_error)?;
        } else {
            let gone: BTreeSet<NodeId> = [id].into();
            self.raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(gone), false)
                .await
                .map_err(membership_error)?;
        }
        self.propose(Command::RetirePeer { id })
            .await
            .map_err(|e| MembershipError::Raft(e.to_string()))?;
        Ok(())
    }

    /// Makes the first membership from `members` (id -> peer address); call it on one
    /// peer of a new cluster. On a cluster that already has one it does nothing.
    pub async fn initialize(&self, members: BTreeMap<NodeId, String>) -> anyhow::Result<()> {
        {
            // A restarted peer has a log: skip the call (openraft would refuse it, with an
            // ERROR line that alarms operators for nothing).
            let m = self.raft.metrics().borrow().clone();
            if m.last_log_index.is_some() || m.current_term > 0 {
                return Ok(());
            }
        }
        let members: BTreeMap<NodeId, Node> = members
            .into_iter()
            .map(|(id, a)| (id, Node::new(a)))
            .collect();
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
    ///
    /// During a leader change a follower may still name the old leader: a forward that
    /// could not even connect was never delivered, so it is retried (with the leader read
    /// again) until [`PROPOSE_WAIT`] has passed. Any other failure is returned at once, as
    /// the command may or may not have been applied.
    pub async fn propose_at(&self, cmd: Command) -> anyhow::Result<(u64, Outcome)> {
        let deadline = tokio::time::Instant::now() + PROPOSE_WAIT;
        let pause = Duration::from_millis(50);
        loop {
            let left = tokio::time::Instant::now() < deadline;
            match self.raft.client_write(cmd.clone()).await {
                Ok(r) => return Ok((r.log_id.index, r.data)),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    match f.leader_node {
                        Some(node) => match self.forward(&node.addr, &cmd).await {
                            Ok(r) => return Ok(r),
                            Err(Forward::NotSent(e)) if left => {
                                tracing::debug!(leader = %node.addr, error = %e, "leader unreachable; retrying");
                                tokio::time::sleep(pause).await;
                            }
                            Err(Forward::NotSent(e)) | Err(Forward::Failed(e)) => return Err(e),
                        },
                        None if left => tokio::time::sleep(pause).await,
                        None => anyhow::bail!("no leader"),
                    }
                }
                Err(e) => return Err(anyhow::anyhow!("propose: {e}")),
            }
        }
    }

    async fn forward(&self, addr: &str, cmd: &Command) -> Result<(u64, Outcome), Forward> {
        let failed = |e: anyhow::Error| Forward::Failed(e);
        let ch = self
            .net
            .channel(addr)
            .map_err(|e| failed(anyhow::anyhow!(e)))?;
        let mut req = tonic::Request::new(RaftMessage {
            cluster_id: self.cluster_id.clone(),
            payload: crate::codec::encode(cmd).map_err(|e| failed(e.into()))?,
            error: String::new(),
        });
        let limit = Duration::from_secs(5);
        req.set_timeout(limit);
        // Bounded here too: a paused leader accepts the connection and never answers.
        let reply = match tokio::time::timeout(limit, PeerClient::new(ch).forward(req)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) if never_connected(&s) => return Err(Forward::NotSent(s.into())),
            Ok(Err(s)) => return Err(failed(s.into())),
            Err(_) => {
                return Err(failed(anyhow::anyhow!(
                    "the leader at {addr} did not answer within {limit:?}"
                )))
            }
        };
        if !reply.error.is_empty() {
            return Err(failed(anyhow::anyhow!("leader refused: {}", reply.error)));
        }
        crate::codec::decode(&reply.payload).map_err(|e| failed(e.into()))
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
            let answers = join_all(pending.iter().map(|(id, addr)| async move {
                if *id == self.id {
                    Some(
                        self.raft
                            .metrics()
                            .borrow()
                            .last_applied
                            .map_or(0, |l| l.index),
                    )
                } else {
                    self.remote_applied(addr).await
                }
            }))
            .await;
            for ((id, addr), applied) in pending.into_iter().zip(answers) {
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

    /// On start: waits, up to `limit`, until this peer has applied as much as the most any
    /// other reachable peer had applied when asked, so that a restarted peer does not route
    /// from the state it had before it went down. Returns (target, applied, caught up);
    /// with no other peer reachable (a new cluster, a partition) it returns at once:
    /// routing never waits for the cluster beyond this bound.
    pub async fn catch_up_on_start(&self, limit: Duration) -> (u64, u64, bool) {
        let deadline = tokio::time::Instant::now() + limit;
        let others: Vec<String> = {
            let m = self.raft.metrics().borrow().clone();
            m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.id)
                .map(|(_, n)| n.addr.clone())
                .collect()
        };
        let target = join_all(others.iter().map(|a| self.remote_applied(a)))
            .await
            .into_iter()
            .flatten()
            .max();
        let applied = || {
            self.raft
                .metrics()
                .borrow()
                .last_applied
                .map_or(0, |l| l.index)
        };
        let Some(target) = target else {
            return (0, applied(), false);
        };
        while applied() < target && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (target, applied(), applied() >= target)
    }

    /// For a peer that started without Raft state: asks the other peers (`peers`: id ->
    /// address, from the config) which peers have ever acknowledged log entries (the
    /// leader records each one in the log, see [`ClusterNode::record_acks`]). If this id is
    /// among them, this peer's data was lost: it must never vote or acknowledge with an empty log (it could vote
    /// twice in a term, or help commit entries it then forgets), so this returns the error
    /// to stop on. If they answer without it (a new cluster, or a peer about to be added),
    /// Raft calls are served from then on. With no other peer answering it waits, asking
    /// again every half second: a cluster cannot form without them anyway.
    pub async fn check_not_lost(&self, peers: &BTreeMap<NodeId, String>) -> anyhow::Result<()> {
        if !self.fresh || self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let others: Vec<(NodeId, &String)> = peers
            .iter()
            .filter(|(id, _)| **id != self.id)
            .map(|(id, a)| (*id, a))
            .collect();
        let mut waited = 0u32;
        while !others.is_empty() {
            let mut answered = false;
            let answers = join_all(others.iter().map(|(_, addr)| self.remote_acked(addr))).await;
            for ((id, addr), acked) in others.iter().zip(answers) {
                let Some(acked) = acked else {
                    continue;
                };
                answered = true;
                if acked.contains(&self.id) {
                    anyhow::bail!(
                        "node {me} has no Raft state in {dir}, but peer {id} ({addr}) says node {me} \
                         acknowledged log entries before: its data was lost, and a peer must never vote with a log it \
                         lost. Remove it (`routerctl peers remove {me}`) and add it back under a \
                         new node id with an empty data directory (`routerctl peers add ID ADDR`)",
                        me = self.id,
                        dir = self.data_dir.display(),
                    );
                }
            }
            if answered {
                break;
            }
            if waited.is_multiple_of(20) {
                tracing::warn!(
                    "no Raft state here and no other peer answers yet: waiting to learn whether \
                     this peer is new or lost its data"
                );
            }
            waited += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// On the leader, every `every`: records in the log each peer (itself included) that
    /// has acknowledged log entries and is not recorded yet, so that every peer can tell a
    /// new peer from one that lost its data. Runs until the node is dropped.
    pub fn record_acks(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(n) = weak.upgrade() else { return };
                let m = n.metrics();
                if m.state != ServerState::Leader {
                    continue;
                }
                let mut acked: Vec<NodeId> = m
                    .replication
                    .as_ref()
                    .map(|r| {
                        r.iter()
                            .filter(|(_, l)| l.is_some_and(|l| l.index > 0))
                            .map(|(id, _)| *id)
                            .collect()
                    })
                    .unwrap_or_default();
                if m.last_log_index.is_some_and(|i| i > 0) {
                    acked.push(n.id);
                }
                let missing: Vec<NodeId> = {
                    let st = n.sm.state.read().await;
                    acked
                        .into_iter()
                        .filter(|id| !st.machine.has_acked(*id))
                        .collect()
                };
                for id in missing {
                    if let Err(e) = n.propose(Command::PeerAcked { id }).await {
                        tracing::debug!(error = %e, id, "could not record a peer's first ack");
                    }
                }
            }
        });
    }

    /// An empty peer request with this cluster's id and a short deadline, and a client to
    /// `addr`: the small questions one peer asks another.
    fn ask(&self, addr: &str) -> Option<(PeerClient<Channel>, tonic::Request<RaftMessage>)> {
        let ch = self.net.channel(addr).ok()?;
        let mut req = tonic::Request::new(RaftMessage {
            cluster_id: self.cluster_id.clone(),
            payload: Vec::new(),
            error: String::new(),
        });
        req.set_timeout(ASK_TIMEOUT);
        Some((PeerClient::new(ch), req))
    }

    async fn remote_acked(&self, addr: &str) -> Option<Vec<NodeId>> {
        let (mut c, req) = self.ask(addr)?;
        let reply = tokio::time::timeout(ASK_TIMEOUT, c.acked(req))
            .await
            .ok()?
            .ok()?
            .into_inner();
        crate::codec::decode(&reply.payload).ok()
    }

    async fn remote_applied(&self, addr: &str) -> Option<u64> {
        let (mut c, req) = self.ask(addr)?;
        let reply = tokio::time::timeout(ASK_TIMEOUT, c.applied(req))
            .await
            .ok()?
            .ok()?
            .into_inner();
        crate::codec::decode(&reply.payload).ok()
    }

    /// Last applied log index and the digest of the state at that index, read together.
    /// Walks the whole state: for status calls, not for anything per request.
    pub async fn applied_digest(&self) -> (u64, u64) {
        let st = self.sm.state.read().await;
        (st.last_applied.map_or(0, |l| l.index), st.machine.digest())
    }

    /// Tokens the applied cache model believes each of `ranks` holds.
    pub async fn rank_tokens(&self, ranks: &[u32]) -> Vec<u64> {
        let st = self.sm.state.read().await;
        ranks
            .iter()
            .map(|r| st.machine.model().rank_tokens(*r))
            .collect()
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
        e => MembershipError::Raft(e.to_string()),
    }
}
