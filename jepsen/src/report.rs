//! report.md: what ran, what was injected, each checker's verdict and figures.

use crate::check::Verdict;
use crate::history::{pair, windows, Event, Type};
use crate::run::Opts;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The report as markdown.
pub fn markdown(o: &Opts, events: &[Event], verdicts: &[Verdict]) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# jepsen run: seed {}, {} s, nemeses {}\n",
        o.seed,
        o.time.as_secs(),
        o.nemeses.join(",")
    );
    let _ = writeln!(
        m,
        "![turn latency](latency.svg)\n\n![commit index per peer](commits.svg)\n"
    );
    let _ = writeln!(m, "| checker | verdict | problems |\n|---|---|---|");
    for v in verdicts {
        let word = match v.valid {
            Some(true) => "valid",
            Some(false) => "**INVALID**",
            None => "unknown",
        };
        let _ = writeln!(m, "| {} | {word} | {} |", v.name, v.problems.len());
    }
    let mut ops: BTreeMap<(String, String), u64> = BTreeMap::new();
    for op in pair(events)
        .iter()
        .filter(|p| p.invoke.process != "nemesis")
    {
        let k = match op.kind() {
            Type::Ok => "ok",
            Type::Fail => "fail",
            _ => "info",
        };
        *ops.entry((op.invoke.f.clone(), k.to_owned())).or_default() += 1;
    }
    let _ = writeln!(
        m,
        "\n## Operations\n\n| op | result | count |\n|---|---|---|"
    );
    for ((f, k), n) in &ops {
        let _ = writeln!(m, "| {f} | {k} | {n} |");
    }
    let _ = writeln!(
        m,
        "\n## Faults\n\n| fault | start s | end s | what |\n|---|---|---|---|"
    );
    for (f, a, b, v) in windows(events) {
        let _ = writeln!(m, "| {f} | {a:.1} | {b:.1} | {v} |");
    }
    for v in verdicts {
        let _ = writeln!(m, "\n## {}\n", v.name);
        for p in v.problems.iter().take(20) {
            let _ = writeln!(m, "- {p}");
        }
        let _ = writeln!(
            m,
            "\n```json\n{}\n```",
            serde_json::to_string_pretty(&v.figures).unwrap_or_default()
        );
    }
    m
}
