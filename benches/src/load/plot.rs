//! `--plot FILE.svg`: latency by percentile, HDR style, hand-written SVG.
//!
//! The x axis is the percentile on the scale `1/(1-p)`, logarithmic, so that
//! 90 %, 99 %, 99.9 % … are evenly spaced and the tail gets as much room as
//! the median; the y axis is the latency in milliseconds. One line per
//! target and view (corrected solid, as sent dashed).
//!
//! ```
//! use fencing_benches::load::plot::{Series, svg};
//! use hdrhistogram::Histogram;
//!
//! let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
//! for i in 1..=1000 { h.record(i * 1_000).unwrap(); }
//! let svg = svg("demo", &[Series { label: "fenced".into(), histogram: &h, dashed: false }]);
//! assert!(svg.starts_with("<svg") && svg.contains("99.9%") && svg.contains("<polyline"));
//! ```

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use super::tally::Tally;

/// One line of the plot.
#[derive(Debug)]
pub struct Series<'a> {
    /// The legend's text.
    pub label: String,
    /// Latencies in nanoseconds.
    pub histogram: &'a Histogram<u64>,
    /// Drawn dashed (the "as sent" view next to a corrected one).
    pub dashed: bool,
}

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
/// The deepest percentile drawn: 99.999 %.
const MAX_NINES: f64 = 5.0;

/// The SVG of every target's latencies (`(label, tally)`): corrected (solid)
/// and as sent (dashed) when the run was an open loop, as sent alone otherwise.
#[must_use]
pub fn of_targets(title: &str, targets: &[(&str, &Tally)]) -> String {
    let mut series = Vec::new();
    for &(label, tally) in targets {
        if tally.intended_latency.is_empty() {
            series.push(Series { label: label.to_owned(), histogram: &tally.sent_latency, dashed: false });
        } else {
            let corrected = format!("{label} (corrected)");
            series.push(Series { label: corrected, histogram: &tally.intended_latency, dashed: false });
            let as_sent = format!("{label} (as sent)");
            series.push(Series { label: as_sent, histogram: &tally.sent_latency, dashed: true });
        }
    }
    svg(title, &series)
}

/// The SVG document for `series`, titled `title`.
#[must_use]
pub fn svg(title: &str, series: &[Series<'_>]) -> String {
    let samples = series.iter().map(|s| s.histogram.len()).max().unwrap_or(0).max(1);
    // A percentile finer than one sample in the run says nothing more.
    let nines = (samples as f64).log10().clamp(1.0, MAX_NINES);
    let decades = nines.ceil();
    let max_ms = series.iter().map(|s| s.histogram.max() as f64 / 1e6).fold(0.0, f64::max);
    let (y_step, y_top) = y_scale(max_ms);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x_of = |n: f64| LEFT + plot_w * n / decades;
    let y_of = |ms: f64| TOP + plot_h * (1.0 - ms / y_top);

    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(out, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = write!(
        out,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    // Grid and axes.
    for d in 0..=(decades as u32) {
        let x = x_of(f64::from(d));
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP + plot_h
        );
        let _ = write!(
            out,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + plot_h + 18.0,
            percentile_label(d)
        );
    }
    let mut ms = 0.0;
    while ms <= y_top + y_step / 2.0 {
        let y = y_of(ms);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            LEFT + plot_w
        );
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            trim(ms)
        );
        ms += y_step;
    }
    let _ = write!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile (scale 1/(1-p), logarithmic)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 16.0
    );
    let _ = write!(
        out,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">latency (ms)</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##
    );
    // One polyline per series, and its legend entry.
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if s.dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let points: Vec<String> = points(s.histogram, nines)
            .into_iter()
            .map(|(n, ms)| format!("{:.1},{:.1}", x_of(n), y_of(ms)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"><title>{}</title></polyline>"#,
            points.join(" "),
            escape(&s.label)
        );
        let y = TOP + 16.0 + 18.0 * i as f64;
        let _ = write!(
            out,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="2"{dash}/>"#,
            LEFT + 12.0,
            LEFT + 40.0
        );
        let _ = write!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, LEFT + 46.0, y + 4.0, escape(&s.label));
    }
    out.push_str("</svg>\n");
    out
}

/// `(nines, ms)` points: `nines = log10(1/(1-p))`, from the median's left (p = 0) to `max_nines`.
fn points(histogram: &Histogram<u64>, max_nines: f64) -> Vec<(f64, f64)> {
    if histogram.is_empty() {
        return Vec::new();
    }
    let steps = 200;
    (0..=steps)
        .map(|i| {
            let n = max_nines * f64::from(i) / f64::from(steps);
            let p = 1.0 - 10f64.powf(-n);
            (n, histogram.value_at_quantile(p) as f64 / 1e6)
        })
        .collect()
}

/// `0%`, `90%`, `99%`, `99.9%` … for decade `d`.
fn percentile_label(d: u32) -> String {
    match d {
        0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        d => format!("99.{}%", "9".repeat(d as usize - 2)).replace("99.%", "99%"),
    }
}

/// A round step and top for `0..=max` milliseconds, about 5 to 10 gridlines.
fn y_scale(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(raw);
    (step, (max / step).ceil() * step)
}

fn trim(ms: f64) -> String {
    let s = format!("{ms:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
