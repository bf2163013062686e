//! What a peer reports about itself, in this crate's own types: the router reads these for
//! `/health`, `/metrics` and `routerctl status` without depending on openraft.

use crate::store::NodeId;

/// A peer's Raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Leads the cluster.
    Leader,
    /// Follows a leader.
    Follower,
    /// Asking for votes.
    Candidate,
    /// Receives the log but does not vote.
    Learner,
    /// Stopped.
    Shutdown,
}

impl Role {
    /// The name shown in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "Leader",
            Role::Follower => "Follower",
            Role::Candidate => "Candidate",
            Role::Learner => "Learner",
            Role::Shutdown => "Shutdown",
        }
    }
}

/// One member of the cluster's current membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub id: NodeId,
    /// Peer address.
    pub addr: String,
    /// Votes (false: a learner).
    pub voter: bool,
    /// The last log index the leader knows it holds (reported only by the leader).
    pub matched_index: Option<u64>,
}

/// A snapshot of one peer's Raft state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// This peer's id.
    pub id: NodeId,
    /// Its role.
    pub role: Role,
    /// Current term.
    pub term: u64,
    /// The leader it knows, if any.
    pub leader: Option<NodeId>,
    /// Last log index held.
    pub last_log_index: u64,
    /// Committed index it knows.
    pub commit_index: u64,
    /// Index applied to the routing state.
    pub applied_index: u64,
    /// Index of the last snapshot.
    pub snapshot_index: u64,
    /// Log purged up to here.
    pub purged_index: u64,
    /// Members of the current membership, voters and learners.
    pub members: Vec<Member>,
}

impl NodeStatus {
    /// Whether this peer leads.
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }

    /// The address of a member, if it is one.
    pub fn addr_of(&self, id: NodeId) -> Option<&str> {
        self.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.addr.as_str())
    }
}

/// Counters of snapshot work on this peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Snapshots built here.
    pub built: u64,
    /// Snapshots received and installed.
    pub installed: u64,
    /// Size of the last one built or installed, bytes.
    pub bytes: u64,
    /// Time the last build took, microseconds.
    pub build_us: u64,
    /// Time the last build held the state lock, microseconds.
    pub lock_us: u64,
    /// Time the last install took, microseconds.
    pub install_us: u64,
}
