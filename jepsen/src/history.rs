//! The history of a run: every operation as an invoke and its completion (ok, fail, or
//! info when the outcome is unknown), nemesis faults, observations of the peers and the
//! engines' request logs, one JSON object per line, times in seconds from the start of the
//! run (monotonic) with the wall clock beside them (engine logs are matched by it).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What happened to an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Type {
    /// Sent.
    Invoke,
    /// Completed; its effect happened.
    Ok,
    /// Completed; it had no effect (refused before anything was proposed).
    Fail,
    /// The outcome is unknown (timeout, connection cut after sending): it may take effect
    /// at any time after its invoke, or never.
    Info,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history.
    #[serde(default)]
    pub index: u64,
    /// Seconds since the start of the run (monotonic).
    pub time: f64,
    /// Seconds since the Unix epoch.
    #[serde(default)]
    pub wall: f64,
    /// Who: `client-N`, `admin-N`, `operator`, `nemesis`, `observer`, `engine-N`.
    pub process: String,
    /// Invoke, ok, fail or info.
    #[serde(rename = "type")]
    pub kind: Type,
    /// The operation: `turn`, `join`, `leave`, `drain`, `undrain`, `peers-add`,
    /// `peers-remove`, `restart-empty`, `status`, `final`, `request`, `log`, or a fault (`kill`, `pause`,
    /// `partition`, ...; invoke = the fault starts, ok = it is healed).
    pub f: String,
    /// Arguments and, on completions, results.
    #[serde(default)]
    pub value: serde_json::Value,
    /// The router the operation went to (router-N), when it went to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<String>,
    /// Error text of a fail or info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An operation with its invoke and completion paired.
#[derive(Debug, Clone)]
pub struct Op<'a> {
    /// The invoke.
    pub invoke: &'a Event,
    /// Its completion; None when the run ended first (treated as info).
    pub done: Option<&'a Event>,
}

impl Op<'_> {
    /// The completion type (info when the run ended first).
    pub fn kind(&self) -> Type {
        self.done.map_or(Type::Info, |d| d.kind)
    }
    /// When it completed (None: never, as far as anyone knows).
    pub fn end(&self) -> Option<f64> {
        self.done.filter(|d| d.kind != Type::Info).map(|d| d.time)
    }
    /// A string argument from the invoke.
    pub fn arg(&self, k: &str) -> Option<&str> {
        self.invoke.value.get(k).and_then(|v| v.as_str())
    }
}

/// Pairs each process's invokes with its next completion (a process runs one operation at
/// a time, as in Jepsen). Events that complete nothing (observations, engine requests)
/// are not operations.
pub fn pair(events: &[Event]) -> Vec<Op<'_>> {
    let mut open: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ops: Vec<Op<'_>> = Vec::new();
    for e in events {
        match e.kind {
            Type::Invoke => {
                open.insert(e.process.as_str(), ops.len());
                ops.push(Op {
                    invoke: e,
                    done: None,
                });
            }
            _ => {
                if let Some(i) = open.remove(e.process.as_str()) {
                    if ops[i].invoke.f == e.f {
                        ops[i].done = Some(e);
                    }
                }
            }
        }
    }
    ops
}

/// Reads a JSON-lines history.
pub fn read(text: &str) -> anyhow::Result<Vec<Event>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| anyhow::anyhow!("history line {}: {e}", i + 1))
        })
        .collect()
}

/// Fault windows: (fault, start, end or the end of the run, value of the start).
pub fn windows(events: &[Event]) -> Vec<(String, f64, f64, serde_json::Value)> {
    let end = events.last().map_or(0.0, |e| e.time);
    pair(events)
        .into_iter()
        .filter(|o| o.invoke.process == "nemesis")
        .map(|o| {
            (
                o.invoke.f.clone(),
                o.invoke.time,
                o.done.map_or(end, |d| d.time),
                o.invoke.value.clone(),
            )
        })
        .collect()
}

#[cfg(test)]
pub mod build {
    //! Hand-made histories for the checkers' tests.
    use super::*;

    /// A history under construction.
    #[derive(Default)]
    pub struct H(pub Vec<Event>);

    impl H {
        /// Appends an event.
        pub fn at(
            mut self,
            time: f64,
            process: &str,
            kind: Type,
            f: &str,
            value: serde_json::Value,
        ) -> Self {
            let index = self.0.len() as u64;
            self.0.push(Event {
                index,
                time,
                wall: 1_000_000.0 + time,
                process: process.into(),
                kind,
                f: f.into(),
                value,
                router: None,
                error: None,
            });
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::H;
    use super::*;
    use serde_json::json;

    #[test]
    fn pairs_and_round_trips() {
        let h = H::default()
            .at(0.0, "admin-1", Type::Invoke, "join", json!({"url": "u"}))
            .at(0.1, "admin-2", Type::Invoke, "leave", json!({"url": "v"}))
            .at(0.2, "admin-1", Type::Ok, "join", json!({"url": "u"}))
            .at(
                0.3,
                "nemesis",
                Type::Invoke,
                "kill",
                json!({"targets": ["router-1"]}),
            );
        let ops = pair(&h.0);
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0].kind(), Type::Ok);
        assert_eq!(ops[1].kind(), Type::Info, "never completed");
        assert_eq!(ops[0].end(), Some(0.2));
        let text: String =
            h.0.iter()
                .map(|e| serde_json::to_string(e).unwrap() + "\n")
                .collect();
        assert_eq!(read(&text).unwrap(), h.0);
        assert_eq!(windows(&h.0)[0].0, "kill");
    }
}
