//! Raft tunables, with their defaults in one place. The router's `[cluster]` table is
//! deserialized straight into [`RaftTunables`] (flattened), so a new knob is added here
//! once and reaches the config file, `--print-config` and openraft without a copy.

use serde::{Deserialize, Serialize};

/// Raft timing and log retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RaftTunables {
    /// Leader heartbeat, ms (default 100). Also openraft's timeout for one append call.
    pub heartbeat_ms: u64,
    /// Election timeout range, ms (default 250-400). openraft lets a follower start an
    /// election `election_max_ms` (the leader lease) plus a random election timeout after
    /// the last heartbeat, so a dead leader is replaced in about 0.65-0.85 s plus a vote.
    pub election_min_ms: u64,
    /// Upper end of the election timeout range, ms.
    pub election_max_ms: u64,
    /// Snapshot after this many applied entries (default 5000).
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot, for peers that lag a little (default 1000).
    pub keep_logs: u64,
}

impl Default for RaftTunables {
    fn default() -> Self {
        RaftTunables {
            heartbeat_ms: 100,
            election_min_ms: 250,
            election_max_ms: 400,
            snapshot_every: 5000,
            keep_logs: 1000,
        }
    }
}

impl RaftTunables {
    /// Checks the values make a working cluster.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.heartbeat_ms > 0
            && self.heartbeat_ms < self.election_min_ms
            && self.election_min_ms < self.election_max_ms)
        {
            return Err(
                "cluster: need 0 < heartbeat_ms < election_min_ms < election_max_ms".into(),
            );
        }
        if self.snapshot_every == 0 {
            return Err("cluster: snapshot_every must be positive".into());
        }
        Ok(())
    }

    /// openraft's config for these values.
    pub(crate) fn openraft(&self, cluster_name: &str) -> anyhow::Result<openraft::Config> {
        Ok(openraft::Config {
            cluster_name: cluster_name.to_owned(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_min_ms,
            election_timeout_max: self.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.keep_logs,
            install_snapshot_timeout: 2_000,
            // An append must finish within one heartbeat interval (openraft's timeout for
            // it); route batches are large, so send few entries per call.
            max_payload_entries: 8,
            ..Default::default()
        }
        .validate()?)
    }
}
