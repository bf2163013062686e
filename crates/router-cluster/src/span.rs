//! The tracing target shared with the router's telemetry.

/// Target of the spans meant for traces (the router's telemetry exports this target only).
pub const SPAN_TARGET: &str = "router::span";
