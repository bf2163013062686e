//! openraft's storage conformance suite on the sled-backed stores.

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use router_cluster::store::{LogStore, NodeId, StateMachineStore, TypeConfig};
use std::path::PathBuf;

/// Removes the database directory when a test ends.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, Dir> for Builder {
    async fn build(&self) -> Result<(Dir, LogStore, StateMachineStore), StorageError<NodeId>> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("router-suite-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        let db = sled::open(&path).expect("open sled");
        let log = LogStore::open(&db, Default::default()).expect("log store");
        let sm = StateMachineStore::open(&db, &path, 10_000, 1_000, None, Default::default())?;
        Ok((Dir(path), log, sm))
    }
}

#[test]
fn sled_store_passes_openraft_suite() {
    if let Err(e) = Suite::test_all(Builder) {
        panic!("storage suite failed: {e}");
    }
}
