//! Draws a laid-out timeline as SVG text: hand-written elements, generic font
//! families, no external assets, so the file renders the same anywhere.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::layout::{AXIS, CAPTION, HEADINGS, LEFT, Layout, TITLE, point_y, slot, text_width};
use super::{BarKind, Timeline, Tone};

const FLAG: &str = "#c81e1e";

/// Fill, stroke and the legend's words for a bar.
fn bar_style(kind: BarKind) -> (&'static str, &'static str, &'static str) {
    match kind {
        BarKind::Lease => ("#cfe0fb", "#3b6fd0", "lease"),
        BarKind::Pause => ("url(#paused)", "#7a7a7a", "paused"),
        BarKind::Inside => ("#d3efd9", "#2f8f46", "inside the handler"),
        BarKind::Waiting => ("#ffe6ad", "#c98a00", "waiting at the door"),
        BarKind::OnTheWire => ("#ececec", "#9a9a9a", "on the wire"),
        BarKind::Mark => ("#e5dbf7", "#6b46c1", "the resource's mark"),
        BarKind::NoMark => ("#f3f3f3", "#b5b5b5", "no fencing: no mark"),
        BarKind::Fault => ("#fbdada", "#c43c3c", "fault"),
    }
}

/// Colour and the legend's words for a point.
fn tone_style(tone: Tone) -> (&'static str, &'static str) {
    match tone {
        Tone::Stored => ("#2f8f46", "stored"),
        Tone::StaleStored => ("#d11f1f", "stale write stored"),
        Tone::Refused => ("#e8590c", "refused (409)"),
        Tone::Waited => ("#c98a00", "stored after waiting"),
        Tone::Unknown => ("#8a8a8a", "no answer"),
        Tone::Lock => ("#3b6fd0", "lock service"),
        Tone::Neutral => ("#555555", "expired / observed"),
    }
}

/// `text` with XML's special characters escaped.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub(super) fn render(timeline: &Timeline, layout: &Layout) -> String {
    let mut svg = String::new();
    let (w, h) = (layout.width, layout.height);
    // `write!` to a String cannot fail.
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"##
    );
    svg.push_str(concat!(
        r##"<defs><pattern id="paused" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)">"##,
        r##"<rect width="6" height="6" fill="#f0f0f0"/><rect width="2.2" height="6" fill="#a8a8a8"/></pattern></defs>"##,
        "\n"
    ));
    let _ = writeln!(svg, r##"<rect width="{w}" height="{h}" fill="#ffffff"/>"##);
    header(&mut svg, timeline);
    sections(&mut svg, timeline, layout);
    lanes(&mut svg, timeline, layout);
    axis(&mut svg, layout);
    leaders(&mut svg, timeline, layout);
    bars(&mut svg, timeline, layout);
    points(&mut svg, timeline, layout);
    legend(&mut svg, timeline, layout);
    svg.push_str("</svg>\n");
    svg
}

fn header(svg: &mut String, timeline: &Timeline) {
    let _ = writeln!(
        svg,
        r##"<text x="16" y="22" font-size="16" font-weight="bold" fill="#222">{}</text>"##,
        esc(&timeline.title)
    );
    for (i, line) in timeline.captions.iter().enumerate() {
        let y = TITLE + CAPTION * i as f64 + 8.0;
        let _ = writeln!(svg, r##"<text x="16" y="{y}" font-size="12" fill="#444">{}</text>"##, esc(line));
    }
}

fn sections(svg: &mut String, timeline: &Timeline, layout: &Layout) {
    let top = layout.lanes_top - HEADINGS + 4.0;
    let bottom = layout.axis_y;
    for (i, section) in timeline.sections.iter().enumerate() {
        let (from, to) = (layout.x(section.from) - 12.0, layout.x(section.to) + 12.0);
        let fill = if i % 2 == 0 { "#f6f7fb" } else { "#fbf8f2" };
        let _ = writeln!(
            svg,
            r##"<rect x="{from}" y="{top}" width="{}" height="{}" fill="{fill}" stroke="#dcdcdc"/>"##,
            to - from,
            bottom - top
        );
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" font-size="12.5" font-weight="bold" fill="#333">{}</text>"##,
            from + 6.0,
            top + 15.0,
            esc(&section.heading)
        );
    }
}

fn lanes(svg: &mut String, timeline: &Timeline, layout: &Layout) {
    for (name, lane) in timeline.lanes.iter().zip(&layout.lanes) {
        let centre = point_y(lane.y);
        let _ = writeln!(
            svg,
            r##"<text x="12" y="{}" font-size="12.5" font-weight="bold" fill="#222">{}</text>"##,
            centre - 4.0,
            esc(name)
        );
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{centre}" x2="{}" y2="{centre}" stroke="#c8c8c8" stroke-dasharray="2 3"/>"##,
            layout.width - 12.0
        );
        let bottom = lane.y + lane.height + 4.0;
        let _ = writeln!(
            svg,
            r##"<line x1="8" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#e6e6e6"/>"##,
            layout.width - 8.0
        );
    }
}

fn axis(svg: &mut String, layout: &Layout) {
    let y = layout.axis_y;
    let right = layout.width - 12.0;
    let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{y}" x2="{right}" y2="{y}" stroke="#555"/>"##);
    for x in layout.ticks() {
        let _ = writeln!(svg, r##"<line x1="{x}" y1="{y}" x2="{x}" y2="{}" stroke="#555"/>"##, y + 5.0);
    }
    for &x in &layout.breaks {
        // A gap drawn shorter than it is: a white gap with two slashes.
        let _ = writeln!(
            svg,
            r##"<rect x="{}" y="{}" width="8" height="8" fill="#ffffff"/><path d="M{} {} l4 -8 M{} {} l4 -8" stroke="#555" fill="none"/>"##,
            x - 4.0,
            y - 4.0,
            x - 5.0,
            y + 4.0,
            x + 1.0,
            y + 4.0
        );
    }
    for (x, row, text) in &layout.axis_labels {
        let _ = writeln!(
            svg,
            r##"<text x="{x}" y="{}" font-family="monospace" font-size="10" fill="#555">{}</text>"##,
            y + 17.0 + 12.0 * *row as f64,
            esc(text)
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="12" y="{}" font-size="11" fill="#555">time since start</text>"##,
        y + 17.0
    );
    let _ = writeln!(
        svg,
        r##"<text x="12" y="{}" font-size="10" fill="#888">(≈: gap shortened)</text>"##,
        y + 30.0
    );
}

fn bars(svg: &mut String, timeline: &Timeline, layout: &Layout) {
    for (bar, placed) in timeline.bars.iter().zip(&layout.bar_labels) {
        let top = layout.lanes[bar.lane.0].y;
        let (offset, height) = slot(bar.kind);
        let (from, to) = (layout.x(bar.from), layout.x(bar.to));
        let (fill, stroke, _) = bar_style(bar.kind);
        let dash = if bar.kind == BarKind::NoMark || bar.kind == BarKind::OnTheWire {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r##"<rect x="{from}" y="{}" width="{}" height="{height}" rx="3" fill="{fill}" stroke="{stroke}"{dash}/>"##,
            top + offset,
            (to - from).max(2.0)
        );
        if bar.label.is_empty() {
            continue;
        }
        if placed.inside {
            inside_label(svg, placed.x, placed.y, &bar.label);
        } else {
            label(svg, placed.x, placed.y, stroke, false, &bar.label);
        }
    }
}

/// A thin line from each labelled point down to its label's row, under everything
/// else so that the labels it passes stay readable.
fn leaders(svg: &mut String, timeline: &Timeline, layout: &Layout) {
    for (point, (placed, _)) in timeline.points.iter().zip(&layout.point_labels) {
        if point.label.is_empty() {
            continue;
        }
        let (x, y) = (layout.x(point.at), point_y(layout.lanes[point.lane.0].y));
        let (colour, _) = tone_style(point.tone);
        let _ = writeln!(
            svg,
            r##"<line x1="{x}" y1="{y}" x2="{x}" y2="{}" stroke="{colour}" stroke-opacity="0.45"/>"##,
            placed.y - 10.0
        );
    }
}

fn points(svg: &mut String, timeline: &Timeline, layout: &Layout) {
    for (point, (placed, flag)) in timeline.points.iter().zip(&layout.point_labels) {
        let (x, y) = (layout.x(point.at), point_y(layout.lanes[point.lane.0].y));
        let (colour, _) = tone_style(point.tone);
        // An unlabelled point (one of a run of alike events) is drawn a little smaller.
        let radius = if point.label.is_empty() { 4.5 } else { 5.5 };
        let _ = writeln!(
            svg,
            r##"<circle cx="{x}" cy="{y}" r="{radius}" fill="{colour}" stroke="#ffffff" stroke-width="1.5"/>"##
        );
        if !point.label.is_empty() {
            label(svg, placed.x, placed.y, colour, false, &point.label);
        }
        if let (Some(why), Some(at)) = (&point.flag, flag) {
            let _ = writeln!(
                svg,
                r##"<circle cx="{x}" cy="{y}" r="10" fill="none" stroke="{FLAG}" stroke-width="2.5"/>"##
            );
            label(svg, at.x, at.y, FLAG, true, why);
        }
    }
}

/// A label in a row: a white halo keeps it readable over the lines it crosses.
fn label(svg: &mut String, x: f64, y: f64, colour: &str, bold: bool, text: &str) {
    let weight = if bold { r#" font-weight="bold""# } else { "" };
    let _ = writeln!(
        svg,
        r##"<text x="{x}" y="{y}" font-family="monospace" font-size="10.5" fill="{colour}" stroke="#ffffff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"{weight}>{}</text>"##,
        esc(text)
    );
}

/// A label inside its bar, over the bar's colour.
fn inside_label(svg: &mut String, x: f64, y: f64, text: &str) {
    let _ = writeln!(
        svg,
        r##"<text x="{x}" y="{y}" font-family="monospace" font-size="10.5" fill="#1f1f1f">{}</text>"##,
        esc(text)
    );
}

/// What the legend shows: the kinds of bar and tones of point the picture uses.
fn legend_entries(timeline: &Timeline) -> (BTreeSet<BarKind>, BTreeSet<Tone>, bool) {
    let kinds = timeline.bars.iter().map(|bar| bar.kind).collect();
    let tones = timeline.points.iter().map(|point| point.tone).collect();
    (kinds, tones, timeline.points.iter().any(|point| point.flag.is_some()))
}

/// The legend's words for a bar: the timeline's own, or the default.
fn bar_words(timeline: &Timeline, kind: BarKind) -> &str {
    timeline.words.bars.get(&kind).map_or(bar_style(kind).2, String::as_str)
}

/// The legend's words for a tone: the timeline's own, or the default.
fn tone_words(timeline: &Timeline, tone: Tone) -> &str {
    timeline.words.tones.get(&tone).map_or(tone_style(tone).1, String::as_str)
}

/// The legend's words for a flag.
fn flag_words(timeline: &Timeline) -> &str {
    timeline.words.flag.as_deref().unwrap_or(FLAGGED)
}

/// The width of one legend entry: swatch, words, space.
fn entry_width(words: &str) -> f64 {
    23.0 + text_width(words) + 14.0
}

/// The legend's width, for the page's.
pub(super) fn legend_width(timeline: &Timeline) -> f64 {
    let (kinds, tones, flagged) = legend_entries(timeline);
    let words = kinds
        .into_iter()
        .map(|kind| bar_words(timeline, kind))
        .chain(tones.into_iter().map(|tone| tone_words(timeline, tone)));
    16.0 + words.chain(flagged.then_some(flag_words(timeline))).map(entry_width).sum::<f64>()
}

const FLAGGED: &str = "flagged by the checker";

/// One entry per kind of bar and tone of point the picture uses, in a row.
fn legend(svg: &mut String, timeline: &Timeline, layout: &Layout) {
    let y = layout.axis_y + AXIS + 8.0;
    let mut x = 16.0;
    let (kinds, tones, flagged) = legend_entries(timeline);
    for kind in kinds {
        let (fill, stroke, _) = bar_style(kind);
        let words = bar_words(timeline, kind);
        let _ = writeln!(
            svg,
            r##"<rect x="{x}" y="{}" width="18" height="10" rx="2" fill="{fill}" stroke="{stroke}"/>"##,
            y - 9.0
        );
        x += legend_words(svg, x, y, "#333", words);
    }
    for tone in tones {
        let (colour, _) = tone_style(tone);
        let words = tone_words(timeline, tone);
        let _ = writeln!(svg, r##"<circle cx="{}" cy="{}" r="5" fill="{colour}"/>"##, x + 9.0, y - 4.0);
        x += legend_words(svg, x, y, "#333", words);
    }
    if flagged {
        let _ = writeln!(
            svg,
            r##"<circle cx="{}" cy="{}" r="6" fill="none" stroke="{FLAG}" stroke-width="2.2"/>"##,
            x + 9.0,
            y - 4.0
        );
        legend_words(svg, x, y, FLAG, flag_words(timeline));
    }
}

/// A legend entry's words in `colour`, right of its mark at `x`; the entry's width.
fn legend_words(svg: &mut String, x: f64, y: f64, colour: &str, words: &str) -> f64 {
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{y}" font-size="11" fill="{colour}">{}</text>"##,
        x + 23.0,
        esc(words)
    );
    entry_width(words)
}
