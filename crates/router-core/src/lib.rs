//! Pure routing logic for the router: no I/O, no async runtime, no clocks.
//!
//! Everything here is deterministic given its inputs, so the same code can drive the data
//! plane, a replicated state machine and logical-time fleet simulations.

pub mod canon;
pub mod fingerprint;
pub mod health;
pub mod index;
mod json;
pub mod machine;
pub mod score;
pub mod secret;

pub use canon::{
    canonicalize, canonicalize_json, fingerprint_json, CanonError, CanonicalPrompt, Endpoint,
    PromptPrint,
};
pub use fingerprint::{FingerprintConfig, Fingerprints};
pub use health::{HealthMachine, HealthThresholds, HealthTransition};
pub use index::{CacheModel, IndexStats, IndexView, ModelSnapshot, RankId};
pub use machine::{Command, Machine, MachineSnapshot, Outcome, RankLoad, Route};
pub use score::{select, Candidate, Decision, Policy, Reason, RouteInput, ScoreParams};
pub use secret::ct_eq;
