//! Pure routing logic for the router: no I/O, no async runtime, no clocks.
//!
//! Everything here is deterministic given its inputs, so the same code can drive the data
//! plane, a replicated state machine and logical-time fleet simulations.

pub mod canon;
pub mod fingerprint;
mod fptable;
pub mod health;
pub mod index;
mod json;
pub mod machine;
mod packed;
pub mod score;
pub mod secret;
pub mod upstream_url;

#[cfg(test)]
mod testrng;

pub use canon::{canonicalize, canonicalize_json, CanonError, CanonicalPrompt, Endpoint};
pub use fingerprint::{fingerprint_json, FingerprintConfig, Fingerprints, PromptPrint};
pub use health::{HealthMachine, HealthThresholds, HealthTransition, Outlier, OutlierConfig};
pub use index::{CacheModel, IndexStats, IndexView, ModelImage, ModelSnapshot, RankId, Route};
pub use machine::{Command, Machine, MachineImage, MachineSnapshot, Outcome, RankLoad, Rejection};
pub use score::{
    explain, select, select_top, Candidate, Decision, Policy, Reason, RouteInput, ScoreParams,
    Scored,
};
pub use secret::ct_eq;
pub use upstream_url::{parse_upstream_url, UpstreamUrl, UrlError};
