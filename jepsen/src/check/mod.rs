//! Checkers over a whole history. Each returns a [`Verdict`]: valid, invalid (with the
//! offending events) or unknown (too little data, or a search too large to finish), and
//! the figures it measured.

pub mod affinity;
pub mod availability;
pub mod convergence;
pub mod elections;
pub mod leave;
pub mod membership;
pub mod servers;
pub mod sound;

use crate::history::Event;
use serde::Serialize;

/// One checker's result.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The checker.
    pub name: &'static str,
    /// Some(true) valid, Some(false) invalid, None unknown.
    pub valid: Option<bool>,
    /// What is wrong (or why it is unknown), with the events involved.
    pub problems: Vec<String>,
    /// What it measured.
    pub figures: serde_json::Value,
}

impl Verdict {
    fn new(name: &'static str, problems: Vec<String>, figures: serde_json::Value) -> Verdict {
        Verdict {
            name,
            valid: Some(problems.is_empty()),
            problems,
            figures,
        }
    }
}

/// Thresholds of the checkers that judge rates.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Seconds after the final heal by which every peer must agree.
    pub converge_secs: f64,
    /// Least share of answered turns at a peer cut off from the other peers but not from
    /// the engines (routing never waits for Raft).
    pub minority_availability: f64,
    /// Least share of main-conversation follow-ups on their rank over the whole run.
    pub affinity: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            converge_secs: 10.0,
            minority_availability: 0.99,
            affinity: 0.95,
        }
    }
}

/// Every checker over `events`.
pub fn all(events: &[Event], limits: &Limits) -> Vec<Verdict> {
    vec![
        servers::check(events),
        convergence::check(events, limits.converge_secs),
        leave::check(events),
        availability::check(events, limits.minority_availability),
        affinity::check(events, limits.affinity),
        elections::check(events),
        membership::check(events),
        sound::check(events),
    ]
}

/// Short text of an event for problem lists.
pub fn show(e: &Event) -> String {
    format!(
        "#{} {:.3}s {} {:?} {} {}{}",
        e.index,
        e.time,
        e.process,
        e.kind,
        e.f,
        e.value,
        e.router
            .as_deref()
            .map(|r| format!(" via {r}"))
            .unwrap_or_default()
    )
}

/// Heal time: when the last fault ended (0 without faults).
pub fn final_heal(events: &[Event]) -> f64 {
    crate::history::windows(events)
        .iter()
        .map(|w| w.2)
        .fold(0.0, f64::max)
}
