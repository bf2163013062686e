//! `routerbench model`: the cache model alone, as one peer's apply task runs it (no Raft,
//! no disk, one thread), on the records `routerbench raft` replicates. What that figure
//! is made of, without the network, the log and three peers sharing two cores.

use crate::raftbench::{join, RecordArgs};
use router_core::{Command, Machine};
use std::time::{Duration, Instant};

/// Applies the records and prints the rate (commands are built outside the timed part);
/// returns the model's counters.
pub fn run(a: RecordArgs) -> anyhow::Result<router_core::IndexStats> {
    a.check()?;
    let mut m = Machine::new(50_000_000, 1_000_000);
    m.apply(&join());
    let mut applying = Duration::ZERO;
    let mut done = 0;
    while done < a.records {
        let n = a.batch.min(a.records - done);
        let routes = (done..done + n).map(|s| a.record(s as u64)).collect();
        let cmd = Command::RecordRoutes {
            peer: 1,
            at_ms: 0,
            routes,
        };
        let t = Instant::now();
        m.apply(&cmd);
        applying += t.elapsed();
        done += n;
    }
    let stats = m.model().stats();
    println!(
        "records {}  fingerprints/record {} ({} new)  conversations {}",
        a.records,
        a.hashes,
        a.fresh(),
        a.conversations.max(1)
    );
    println!(
        "applied: {:.0} records/s ({:.2} s)",
        a.records as f64 / applying.as_secs_f64(),
        applying.as_secs_f64()
    );
    println!(
        "cache model: {} entries, {} capacity evictions, digest {:016x}",
        stats.entries,
        stats.capacity_evictions,
        m.digest()
    );
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short profile of the thrashing case: every rank's modelled KV overflows, the
    /// model evicts down to its capacity and stays within it.
    #[test]
    fn thrashing_records_stay_within_the_modelled_capacity() {
        let s = run(RecordArgs {
            records: 20_000,
            batch: 512,
            hashes: 80,
            conversations: 5000,
            new: 4,
        })
        .unwrap();
        // 16 ranks of 10M tokens in 512-token chunks.
        assert!(s.entries <= 16 * 10_000_000 / 512, "{s:?}");
        assert!(s.capacity_evictions > 1_000_000, "{s:?}");
    }
}
