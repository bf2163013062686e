//! Plots for the report, as SVG written here (no plotting dependency): turn latency over
//! time with fault windows shaded, and each peer's commit index over time.

use crate::history::{pair, windows, Event, Type};
use std::collections::BTreeMap;
use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 320.0;
const PAD: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// One series: label and (x, y) points.
type Series = (String, Vec<(f64, f64)>);

fn frame(title: &str, y_label: &str, t_max: f64, y_max: f64, events: &[Event]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{PAD}\" y=\"16\" font-size=\"13\">{title}</text>"
    );
    let x = |t: f64| PAD + (W - 2.0 * PAD) * t / t_max.max(1e-9);
    for (f, a, b, _) in windows(events) {
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{PAD}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#f2c14e\" fill-opacity=\"0.25\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#8a6d00\">{f}</text>",
            x(a),
            (x(b) - x(a)).max(1.0),
            H - 2.0 * PAD,
            x(a) + 2.0,
            PAD - 4.0
        );
    }
    let _ = write!(
        s,
        "<line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" stroke=\"black\"/>\
         <text x=\"{r}\" y=\"{t}\" text-anchor=\"end\">time (s), 0-{t_max:.0}</text>\
         <text x=\"4\" y=\"{PAD}\">{y_max:.3}</text><text x=\"4\" y=\"{b}\">0</text>\
         <text x=\"4\" y=\"{m}\">{y_label}</text>",
        b = H - PAD,
        r = W - PAD,
        t = H - PAD + 16.0,
        m = H / 2.0
    );
    s
}

fn svg(title: &str, y_label: &str, series: &[Series], events: &[Event], dots: bool) -> String {
    let t_max = events.last().map_or(1.0, |e| e.time).max(1.0);
    let y_max = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-6);
    let mut s = frame(title, y_label, t_max, y_max, events);
    let x = |t: f64| PAD + (W - 2.0 * PAD) * t / t_max;
    let y = |v: f64| H - PAD - (H - 2.0 * PAD) * v / y_max;
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        if dots {
            for (a, b) in pts {
                let _ = write!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.5\" fill=\"{c}\" fill-opacity=\"0.6\"/>",
                    x(*a),
                    y(*b)
                );
            }
        } else {
            let path: Vec<String> = pts
                .iter()
                .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
                .collect();
            let _ = write!(
                s,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\" points=\"{}\"/>",
                path.join(" ")
            );
        }
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{c}\">{label}</text>",
            W - PAD + 4.0,
            PAD + 14.0 * i as f64
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Turn latency over time, one colour per outcome (ok, fail, info), fault windows shaded.
pub fn latency(events: &[Event]) -> String {
    let mut by: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    let end = events.last().map_or(0.0, |e| e.time);
    for o in pair(events).iter().filter(|o| o.invoke.f == "turn") {
        let (k, t) = match o.done {
            Some(d) => (
                match d.kind {
                    Type::Ok => "ok",
                    Type::Fail => "fail",
                    _ => "info",
                },
                d.time,
            ),
            None => ("info", end),
        };
        by.entry(k)
            .or_default()
            .push((o.invoke.time, t - o.invoke.time));
    }
    let series: Vec<Series> = by.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    svg("turn latency", "seconds", &series, events, true)
}

/// Each peer's commit index over time, from the observer's status reads.
pub fn commits(events: &[Event]) -> String {
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.f == "status" && e.kind == Type::Ok)
    {
        if let (Some(p), Some(c)) = (e.value["peer"].as_str(), e.value["commit"].as_u64()) {
            by.entry(p.to_owned()).or_default().push((e.time, c as f64));
        }
    }
    let series: Vec<Series> = by.into_iter().collect();
    svg("commit index per peer", "index", &series, events, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H as Hist;
    use crate::history::Type::*;
    use serde_json::json;

    #[test]
    fn plots_have_a_point_per_turn_and_a_band_per_fault() {
        let h = Hist::default()
            .at(0.0, "nemesis", Invoke, "kill", json!({}))
            .at(0.5, "client-1", Invoke, "turn", json!({}))
            .at(0.7, "client-1", Ok, "turn", json!({}))
            .at(0.8, "client-1", Invoke, "turn", json!({}))
            .at(1.8, "client-1", Fail, "turn", json!({}))
            .at(2.0, "nemesis", Ok, "kill", json!({}))
            .at(
                2.1,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "commit": 5}),
            )
            .at(
                2.2,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "commit": 9}),
            );
        let l = latency(&h.0);
        assert_eq!(l.matches("<circle").count(), 2);
        assert!(l.contains(">kill<") && l.contains(">ok<") && l.contains(">fail<"));
        let c = commits(&h.0);
        assert_eq!(c.matches("<polyline").count(), 1);
        assert!(c.contains("router-1"));
    }
}
