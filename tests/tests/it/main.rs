//! The integration tests: one binary (one link step), a module per area. Each test starts
//! the real `router`, `enginesim`, `routerctl` and `routerbench` binaries and talks to them
//! over sockets as a user would.

mod admin;
mod agent;
mod config;
mod errors;
mod failures;
mod limits;
mod persistence;
mod prometheus;
mod routing;
mod security;
mod streaming;
mod structure;
mod tracing;
